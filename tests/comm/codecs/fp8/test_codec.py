"""The fp8 codec (Oyama et al. 2020): its sampled ranges, its settings and its state."""

import copy
import math

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import Channel, CodecSettings, Fp8Options, make_codec
from scalesgd.comm.codecs.fp8.ranges import TensorRange, sample_quantiles
from scalesgd.comm.engine.ddp_hook import CodecHookState, codec_hook
from scalesgd.comm.engine.optimizer import DistributedOptimizer
from scalesgd.comm.wire.topology import Topology
from scalesgd.errors import UsageError
from scalesgd.models import build_model
from scalesgd.options import check_fields
from scalesgd.recipe import initialize
from tests.comm.exchanging import exchange, view_of
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


def test_options_name_what_is_wrong_as_the_command_line_names_them():
    check_fields(Fp8Options(), prefix="fp8")  # the defaults are valid
    for bad, message in ((Fp8Options(eps=0), "`fp8_eps` 0: must be a positive number"),
                         (Fp8Options(quantile=1.5), "`fp8_quantile` 1.5: must be in (0, 1]"),
                         (Fp8Options(period=0), "`fp8_period` 0: must be >= 1 (steps)"),
                         (Fp8Options(samples=0), "`fp8_samples` 0: must be >= 1"),
                         (Fp8Options(headroom=math.nan), "`fp8_headroom` nan: must be >= 1")):
        with pytest.raises(UsageError) as err:
            make_codec("fp8-flat", CodecSettings(bad))
        assert str(err.value).startswith(message)


def state_round_trip(rank, world):
    groups = Topology(1, 0, 1).groups()
    channel = Channel(dist.group.WORLD, 1, "ring", groups)
    params = [torch.randn(3000), torch.randn(50)]
    view = view_of(params)
    opts = Fp8Options(period=2, samples=100)
    first, second = (make_codec("fp8", CodecSettings(opts, seed=1)) for _ in range(2))
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(3050, generator=gen) * (1 + i) for i in range(5)]
    for g in grads[:3]:
        exchange(first, g.clone(), view, channel)
    second.load_state_dict(first.state_dict())
    same = []
    for g in grads[3:]:
        a, b = g.clone(), g.clone()
        exchange(first, a, view, channel)
        exchange(second, b, view, channel)
        same.append(torch.equal(a, b) and not torch.equal(a, g))  # fp8 rounded it, both alike
    return same, [t["step"] for t in first.state_dict()["tensors"].values()]


def test_codec_state_restores_ranges_step_and_sampling():
    same, steps = run_workers(state_round_trip, 1)[0]
    assert same == [True, True]  # the 5th encode re-measures (period 2): same samples after the restore
    assert steps == [5, 5]


def test_a_range_that_measures_zero_or_not_finite_is_not_a_range():
    r = TensorRange()
    assert r.due(period=100)
    r.update(quantile=0.0, largest=3e-7)  # most elements zero (zero-γ): the exact max stands in
    assert (r.q, r.measured) == (3e-7, False) and r.due(period=100)  # measured again next step
    r.update(quantile=2e-7, largest=5e-7)
    assert (r.q, r.measured) == (2e-7, True)
    r.step = 1
    assert not r.due(period=100)
    r.update(quantile=0.0, largest=0.0)  # all zeros now: keep the last range, look again next step
    assert (r.q, r.measured) == (2e-7, False)
    r.update(quantile=math.inf, largest=math.inf)  # an inf somewhere: the flag says so, the range stays
    assert (r.q, r.measured) == (2e-7, False)
    fresh = TensorRange()
    fresh.update(0.0, 0.0)
    assert fresh.q == 1.0  # a tensor of zeros: any range is exact


def follow_fp8(rank, world, under_ddp):
    """Train zero-γ resnet8 with fp8 for 4 range periods; per step and tensor, the cosine between the decoded
    gradient and fp32's exact mean of the same local gradients."""
    torch.manual_seed(0)
    model = initialize(build_model("resnet8", 10, 3))  # zero-γ: the blocks' conv1/bn1/conv2 start at 0
    twin = copy.deepcopy(model)
    settings = CodecSettings(Fp8Options(period=3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if under_ddp:
        net = DistributedDataParallel(model)
        state = CodecHookState("fp8", settings=settings, compress_after=0)
        net.register_comm_hook(state, codec_hook)
        engine = None
    else:
        net, engine = model, DistributedOptimizer(optimizer, model, codec=make_codec("fp8", settings),
                                                  buckets="size:0.05")
    worst, zero_steps = 1.0, 0
    for step in range(12):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
        twin.load_state_dict(model.state_dict())
        twin.zero_grad()
        nn.functional.cross_entropy(twin(x), y).backward()
        exact = [p.grad.clone() for p in twin.parameters()]
        for e in exact:
            dist.all_reduce(e)
            e.div_(world)
        nn.functional.cross_entropy(net(x), y).backward()
        if engine is not None:
            engine.synchronize()
        for p, e in zip(model.parameters(), exact):
            if e.norm() > 0:
                worst = min(worst, float(nn.functional.cosine_similarity(p.grad.flatten(), e.flatten(), dim=0)))
            else:
                zero_steps += 1
        (engine or optimizer).step()
        optimizer.zero_grad(set_to_none=True)
    if engine is not None:
        engine.close()
    return worst, zero_steps


@pytest.mark.parametrize("under_ddp", [False, True], ids=["engine", "ddp-hook"])
def test_zero_gamma_tensors_get_their_fp8_gradient_from_the_first_step(under_ddp):
    for worst, zero_steps in run_workers(follow_fp8, 2, under_ddp):
        assert zero_steps > 0  # the zero-γ blocks' tensors really start with a zero gradient
        assert worst > 0.99


def stale_range(rank, world):
    """A range measured on small gradients, then gradients 10⁵× larger: the tensor saturates, and after the
    window its bucket goes dense and the codec says so."""
    channel = Channel(dist.group.WORLD, world, "ring", None)
    params = [torch.ones(4000), torch.ones(100)]
    view = view_of(params)
    codec = make_codec("fp8-flat", CodecSettings(Fp8Options(period=1000, saturation_limit=0.01,
                                                            saturation_window=3)))
    gen = torch.Generator().manual_seed(rank)
    seen = []
    for step in range(6):
        g = torch.randn(4100, generator=gen) * (1e-5 if step == 0 else 1.0)
        exact = g.clone()
        dist.all_reduce(exact)
        exact /= world
        out = g.clone()
        exchange(codec, out, view, channel)
        seen.append((codec.counters(), bool(torch.equal(out, exact)), codec.pop_notices()))
    return seen


def test_a_tensor_that_stays_saturated_is_sent_dense_and_the_codec_says_so():
    for seen in run_workers(stale_range, 2):
        counters = [c for c, _, _ in seen]
        assert counters[0]["fp8_saturated"] < 0.06 and counters[1]["fp8_saturated"] > 0.5
        assert all(0 <= c["fp8_flushed"] <= 1 for c in counters[:3])
        notices = [n for _, _, n in seen]
        assert [bool(n) for n in notices] == [False, False, False, True, False, False]
        assert "its bucket is exchanged dense" in notices[3][0][1]
        assert [exact for _, exact, _ in seen] == [False, False, False, False, True, True]  # fp32 from step 5
        assert counters[4] == {}  # nothing fp8 to count on a dense bucket
