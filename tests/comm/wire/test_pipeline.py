"""Pieces of a bucket in flight at once: the driver's order, and the fp8 exchange cut into pieces."""

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.codecs import BucketView, Channel, CodecSettings, Fp8Options, make_codec
from scalesgd.comm.wire.pipeline import run_pipelined
from scalesgd.comm.wire.topology import Topology
from tests.spawn_util import run_workers


class Done:
    """A posted step that is already complete; it records when it was waited for."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait(self):
        self.log.append(("wait", self.name))


def job(log, name, steps):
    log.append(("start", name))
    for s in range(steps):
        yield [Done(log, f"{name}{s}")]
        log.append(("resume", f"{name}{s}"))
    return 10


def test_the_driver_keeps_depth_jobs_started_and_resumes_the_oldest_posted_step():
    log = []
    sent = run_pipelined((job(log, n, 2) for n in "abc"), depth=2)
    assert sent == 30
    assert log == [("start", "a"), ("start", "b"),
                   ("wait", "a0"), ("resume", "a0"),  # a posts a1 after b0: b0 is resumed first
                   ("wait", "b0"), ("resume", "b0"),
                   ("wait", "a1"), ("resume", "a1"),  # a is done: c starts
                   ("start", "c"),
                   ("wait", "b1"), ("resume", "b1"),
                   ("wait", "c0"), ("resume", "c0"), ("wait", "c1"), ("resume", "c1")]


def test_depth_one_runs_the_jobs_one_after_another():
    log = []
    run_pipelined((job(log, n, 1) for n in "ab"), depth=1)
    assert log == [("start", "a"), ("wait", "a0"), ("resume", "a0"), ("start", "b"), ("wait", "b0"), ("resume", "b0")]
    with pytest.raises(ValueError, match="depth 0"):
        run_pipelined([], depth=0)


def pieces(rank, world, procs_per_node, name):
    """One bucket exchanged whole and cut into pieces of several sizes and depths: the decoded means."""
    groups = Topology(world, rank, procs_per_node).groups()
    channel = Channel(dist.group.WORLD, world, "ring", groups)
    gen = torch.Generator().manual_seed(3)
    params = [torch.randn(n, generator=gen) + 2 for n in (5000, 1, 2999, 700)]
    view = BucketView(0, params, [0, 5000, 5001, 8000], 8700)
    grad = torch.randn(8700, generator=torch.Generator().manual_seed(10 + rank))
    grad[6000] = 1e8 * (rank + 1)  # one element far above its tensor's range: it saturates
    out = {}
    for segment, depth in [(10 ** 6, 1), (1000, 1), (1000, 3), (333, 2), (64, 4)]:
        codec = make_codec(name, CodecSettings(Fp8Options(samples=8)))  # the samples miss the outlier
        codec.segment, codec.depth = segment, depth
        g = grad.clone()
        sent = codec.exchange(g, view, channel)
        out[(segment, depth)] = (g, sent, codec.counters())
    return out


@pytest.mark.parametrize("world,procs_per_node,name", [(2, 1, "fp8"), (4, 2, "fp8"), (3, 1, "fp8-flat")])
def test_an_exchange_in_pieces_gives_the_whole_exchange_s_mean_on_every_rank(world, procs_per_node, name):
    results = run_workers(pieces, world, procs_per_node, name)
    grads = torch.stack([torch.randn(8700, generator=torch.Generator().manual_seed(10 + r)) for r in range(world)])
    for r in range(world):
        grads[r, 6000] = 1e8 * (r + 1)
    mean = grads.mean(0)
    whole, whole_sent, whole_counters = results[0][(10 ** 6, 1)]
    assert whole_counters["fp8_saturated"] > 0  # the outlier clipped and was counted
    for key, (g, sent, counters) in results[0].items():
        assert counters == whole_counters, key
        assert abs(sent - whole_sent) <= 2 * world * (8700 // key[0] + 1), key  # a ring's chunks round per piece
        close = (g - mean).abs() <= 2.0 ** -3 * grads.abs().mean(0) * (world + 1) + 1e-3  # e5m2's roundings
        assert not close[6000] and close.float().mean() > 0.999, key  # the few elements beyond 8 samples' range clip
        for r in range(1, world):
            assert torch.equal(results[r][key][0], g), (key, r)  # every rank decodes the same bytes
        if name == "fp8" and world // procs_per_node <= 2:  # rings of two nodes: sums do not depend on the cut
            assert torch.equal(g, whole), key



def apart(rank, world):
    """The three steps called apart, decoding into a buffer other than the one encoded: the same mean."""
    groups = Topology(world, rank, 1).groups()
    channel = Channel(dist.group.WORLD, world, "ring", groups)
    params = [torch.randn(3000, generator=torch.Generator().manual_seed(1)) + 2]
    view = BucketView(0, params, [0], 3000)
    grad = torch.randn(3000, generator=torch.Generator().manual_seed(20 + rank))
    whole, first = make_codec("fp8", CodecSettings()), make_codec("fp8", CodecSettings())
    g = grad.clone()
    whole.exchange(g, view, channel)
    wire = first.encode(grad.clone(), view, channel)
    first.communicate(wire, view, channel)
    out = torch.full((3000,), 7.0)
    first.decode(wire, view, out, channel)
    return torch.equal(out, g)


def test_decoding_into_another_buffer_gives_the_same_mean():
    assert run_workers(apart, 2) == [True, True]
