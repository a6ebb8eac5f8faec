"""Our codecs as DDP comm hooks: the same bytes as our engine, state that round-trips, a thread that stops."""

import os
import pickle

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import CodecSettings, Fp8Options, make_codec
from scalesgd.comm.ddp_hooks import CodecHookState, codec_hook
from scalesgd.comm.engine import DistributedOptimizer
from scalesgd.models import build_model
from tests.spawn_util import run_workers

EXACT = Fp8Options(samples=10 ** 7)  # every tensor is smaller: quantiles exact, independent of sampling


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
                                      codec=make_codec(codec, CodecSettings(EXACT)), buckets="single")
        torch.nn.functional.cross_entropy(model(x), y).backward()
        engine.synchronize()
        out[codec] = grads_of(model)
        engine.close()
    model = fresh_model()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(CodecHookState("fp8", settings=CodecSettings(EXACT)), codec_hook)
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


def hook_state_life(rank, world):
    """A hook state by name and by instance: the codec's state round-trips, close() stops its thread."""
    by_name = CodecHookState("topk", settings=CodecSettings(density=0.5, topk_reuse=1))
    model = fresh_model()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(by_name, codec_hook)
    x, y = batch(rank)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    saved = by_name.state_dict()
    again = CodecHookState(make_codec("topk", CodecSettings(density=0.5, topk_reuse=1)))
    again.load_state_dict(saved)
    same = all(torch.equal(a["residual"], b["residual"])
               for a, b in zip(saved["buckets"].values(), again.state_dict()["buckets"].values()))
    by_name.close()
    with pytest.raises(RuntimeError):  # no exchange runs after close()
        by_name._worker.submit(lambda: None)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(again)
    again.close()
    return same, len(saved["buckets"])


def test_hook_state_round_trips_its_codec_and_stops():
    for same, buckets in run_workers(hook_state_life, 2):
        assert same and buckets >= 1
