import os

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import BucketView, Exchange, Fp8Options, make_codec
from scalesgd.comm.codecs.fp8 import sample_quantiles
from scalesgd.comm.engine import DistributedOptimizer
from scalesgd.comm.topology import Topology
from scalesgd.ddp_hooks import Fp8HookState, fp8_hook
from scalesgd.models import build_model
from tests.spawn_util import run_workers

EXACT = Fp8Options(samples=10 ** 7)  # every tensor is smaller: quantiles exact, independent of sampling


def test_sampled_quantile_matches_torch_quantile_on_large_samples():
    gen = torch.Generator().manual_seed(0)
    g = torch.cat([torch.randn(1_000_000, generator=gen) * 1e-3, torch.randn(300, generator=gen)])
    w = torch.randn(g.numel(), generator=gen)
    opts = Fp8Options(samples=200_000, quantile=0.95)
    q = sample_quantiles(g, w, [0, 1_000_000], [1_000_000, 300], opts, gen)
    d = g.abs() / (w.abs() + opts.eps)
    exact_big = torch.quantile(d[:1_000_000][torch.randperm(1_000_000, generator=gen)[:16_000_000]], 0.95)
    assert abs(q[0] / exact_big - 1) < 0.03
    assert q[1] == torch.quantile(d[1_000_000:], 0.95)  # small tensors use every element
    q_direct = sample_quantiles(g, None, [0], [g.numel()], opts, gen)
    assert abs(q_direct[0] / torch.quantile(g.abs()[::2], 0.95) - 1) < 0.03


def test_options_name_what_is_wrong():
    assert Fp8Options().problems() == []
    assert Fp8Options(eps=0, quantile=1.5, period=0, samples=0).problems() == [
        "fp8 eps must be > 0, got 0", "fp8 quantile must be in (0, 1], got 1.5",
        "fp8 period must be ≥ 1 step, got 0", "fp8 samples must be ≥ 1, got 0"]
    with pytest.raises(ValueError, match="quantile"):
        make_codec("fp8", Fp8Options(quantile=0))


def batch(rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)


def fresh_model():
    torch.manual_seed(0)
    return build_model("resnet8", 10, 3)


def grads_of(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def engine_and_hook(rank, world):
    os.environ["LOCAL_WORLD_SIZE"] = "2"  # 2 nodes × 2 processes on loopback
    x, y = batch(rank)
    out = {}
    for codec in ("fp8", "fp8-direct", "fp8-flat", "fp32"):
        model = fresh_model()
        engine = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                      codec=make_codec(codec, EXACT), buckets="single")
        torch.nn.functional.cross_entropy(model(x), y).backward()
        engine.synchronize()
        out[codec] = grads_of(model)
        engine.close()
    model = fresh_model()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(Fp8HookState(fp8_options=EXACT), fp8_hook)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    out["hook"] = grads_of(model)
    return out


def test_engine_and_ddp_hook_give_the_same_fp8_gradients_on_every_rank():
    results = run_workers(engine_and_hook, 4)
    first = results[0]
    assert torch.equal(first["hook"], first["fp8"])
    for other in results[1:]:
        for key in first:
            assert torch.equal(other[key], first[key]), key
    exact = first["fp32"]
    for codec in ("fp8", "fp8-direct", "fp8-flat"):
        cosine = torch.nn.functional.cosine_similarity(first[codec], exact, dim=0)
        assert cosine > 0.95, (codec, cosine)


def state_round_trip(rank, world):
    groups = Topology(1, 0, 1).groups()
    exchange = Exchange(dist.group.WORLD, 1, "ring", groups)
    params = [torch.randn(3000), torch.randn(50)]
    view = BucketView(0, params, [0, 3000], 3050)
    opts = Fp8Options(period=2, samples=100)
    first, second = make_codec("fp8", opts, seed=1), make_codec("fp8", opts, seed=1)
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(3050, generator=gen) * (1 + i) for i in range(5)]
    for g in grads[:3]:
        first.encode(g.clone(), view, exchange)
    second.load_state_dict(first.state_dict())
    return [torch.equal(first.encode(g.clone(), view, exchange), second.encode(g.clone(), view, exchange))
            for g in grads[3:]], [t["step"] for t in first.state_dict()["tensors"].values()]


def test_codec_state_restores_ranges_step_and_sampling():
    same, steps = run_workers(state_round_trip, 1)[0]
    assert same == [True, True]  # the 5th encode re-measures (period 2): same samples after the restore
    assert steps == [5, 5]
