import math

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.codecs import BucketView, Channel, CodecSettings, make_codec
from scalesgd.comm.codecs.topk import TopkCodec
from scalesgd.comm.engine import DistributedOptimizer
from scalesgd.models import build_model
from tests.spawn_util import run_workers

VIEW = BucketView(0, [], [0], 5000)
LOCAL = Channel(None, 1)


def grads(steps, n=5000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) * (1 + i) for i in range(steps)]


def test_residuals_are_conserved_sent_plus_kept_equals_accumulated():
    codec = TopkCodec("topk", density=0.05, reuse=3)
    residual = torch.zeros(5000)
    for g in grads(7):
        accumulated = residual + g
        codec.encode(g.clone(), VIEW, LOCAL)
        idx, values = codec._sent.pop(0)
        kept = codec._state[0].residual
        sent = torch.zeros(5000).index_put_((idx.long(),), values)
        assert torch.equal(sent + kept, accumulated)
        assert torch.all(kept[idx.long()] == 0)
        residual = kept.clone()


def test_at_recompute_steps_the_threshold_selects_exactly_the_top_k():
    codec = TopkCodec("topk", density=0.01, reuse=4)
    k = math.ceil(0.01 * 5000)
    for step, g in enumerate(grads(9)):
        before = codec._state[0].residual.clone() if 0 in codec._state else torch.zeros(5000)
        codec.encode(g.clone(), VIEW, LOCAL)
        idx, _ = codec._sent.pop(0)
        accumulated = (before + g).abs()
        threshold = codec._state[0].threshold
        by_threshold = set(torch.nonzero(accumulated >= threshold).view(-1).tolist())
        if step % 4 == 0:  # recompute: exactly k, and the threshold alone picks the same set
            assert len(idx) == k
            assert set(idx.tolist()) == set(torch.topk(accumulated, k).indices.tolist()) == by_threshold
        else:  # reuse: everything at or above the last exact threshold
            assert set(idx.tolist()) == by_threshold


def test_state_round_trip_continues_identically():
    first, second = TopkCodec("topk", 0.1, 3), TopkCodec("topk", 0.1, 3)
    steps = grads(6)
    for g in steps[:4]:
        first.encode(g.clone(), VIEW, LOCAL)
    second.load_state_dict(first.state_dict())
    for g in steps[4:]:
        first.encode(g.clone(), VIEW, LOCAL)
        second.encode(g.clone(), VIEW, LOCAL)
        a, b = first._sent.pop(0), second._sent.pop(0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="density"):
        make_codec("topk", CodecSettings(density=0))
    with pytest.raises(ValueError, match="reuse"):
        TopkCodec("topk", 0.1, 0)


def engine_grads(rank, world, codec, density):
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
    buckets = {"topk": "size:0.01", "topk-global": "single", "lags": "layer"}[codec]
    engine = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                  codec=make_codec(codec, CodecSettings(density=density, topk_reuse=2)), buckets=buckets)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    engine.synchronize()
    out = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    engine.close()
    if density == 1.0:  # compare with the plain mean
        torch.manual_seed(0)
        plain = build_model("resnet8", 10, 3)
        torch.nn.functional.cross_entropy(plain(x), y).backward()
        ref = torch.cat([p.grad.reshape(-1) for p in plain.parameters()])
        dist.all_reduce(ref)
        return out, ref / world
    return out, None


@pytest.mark.parametrize("codec", ["topk", "topk-global", "lags"])
def test_sparse_codecs_in_the_engine_give_every_rank_the_same_gradients(codec):
    results = run_workers(engine_grads, 3, codec, 0.1)
    for out, _ in results[1:]:
        assert torch.equal(out, results[0][0])
    nonzero = (results[0][0] != 0).float().mean().item()
    assert 0.05 < nonzero <= 0.3 + 1e-6  # up to 3 ranks × 10 % of the entries


def test_density_one_sends_everything_and_equals_the_mean():
    for out, ref in run_workers(engine_grads, 2, "topk", 1.0):
        assert torch.allclose(out, ref, atol=1e-6)
