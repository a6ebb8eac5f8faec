"""The one path every codec takes: a bucket cut into pieces, several in flight, each part timed and traced."""

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.codecs import Channel, CodecSettings, Fp8Options, TopkOptions, make_codec
from scalesgd.comm.engine.driver import BucketDriver
from scalesgd.comm.wire.topology import Topology
from scalesgd.trace import Tracer
from tests.spawn_util import run_workers

PIECES = [(10 ** 7, 1), (1000, 1), (1000, 3), (333, 2), (64, 4)]  # (piece bytes, depth): whole first


def in_pieces(rank, world, procs_per_node, name):
    """One bucket exchanged whole and cut into pieces of several sizes and depths: the means, bytes, counters."""
    groups = Topology(world, rank, procs_per_node).groups()
    gen = torch.Generator().manual_seed(3)
    params = [torch.randn(n, generator=gen) + 2 for n in (5000, 1, 2999, 700)]
    grad = torch.randn(8700, generator=torch.Generator().manual_seed(10 + rank))
    grad[6000] = 1e8 * (rank + 1)  # one element far above its tensor's range: it saturates in fp8
    out = {}
    for piece_bytes, depth in PIECES:
        channel = Channel(dist.group.WORLD, world, "ring", groups, piece_bytes=piece_bytes)
        driver = BucketDriver(make_codec(name, CodecSettings(Fp8Options(samples=8))), channel, depth=depth)
        view = driver.view(0, params, [0, 5000, 5001, 8000], 8700)
        g = grad.clone()
        sent = driver.exchange(g, view)
        out[(piece_bytes, depth)] = (g, sent, driver.codec.counters())
    return out


@pytest.mark.parametrize("world,procs_per_node,name", [(2, 1, "fp8"), (4, 2, "fp8"), (3, 1, "fp8-flat"),
                                                       (3, 1, "fp16"), (2, 1, "fp32")])
def test_an_exchange_in_pieces_gives_the_whole_exchange_s_mean_on_every_rank(world, procs_per_node, name):
    results = run_workers(in_pieces, world, procs_per_node, name)
    grads = torch.stack([torch.randn(8700, generator=torch.Generator().manual_seed(10 + r)) for r in range(world)])
    for r in range(world):
        grads[r, 6000] = 1e8 * (r + 1)
    mean = grads.mean(0)
    whole, whole_sent, whole_counters = results[0][PIECES[0]]
    fp8 = name.startswith("fp8")
    if fp8:
        assert whole_counters["fp8_saturated"] > 0  # the outlier clipped and was counted
    for key, (g, sent, counters) in results[0].items():
        assert counters == whole_counters, key
        pieces = 8700 // (key[0] // (1 if fp8 else 4 if name == "fp32" else 2)) + 1
        assert abs(sent - whole_sent) <= 2 * world * pieces * (1 if fp8 else 4), key  # a ring rounds per piece
        if fp8:
            close = (g - mean).abs() <= 2.0 ** -3 * grads.abs().mean(0) * (world + 1) + 1e-3  # e5m2's roundings
            assert not close[6000] and close.float().mean() > 0.999, key  # beyond 8 samples' range it clips
        elif name == "fp16":  # the outlier overflows to inf, and is counted; the rest rounds to 11 bits
            assert torch.isinf(g[6000]) and counters["fp16_overflow"] > 0, key
            assert torch.allclose(g[:6000], mean[:6000], rtol=2e-3, atol=2e-3), key
        else:
            assert torch.allclose(g, mean, rtol=1e-6), key
        for r in range(1, world):
            assert torch.equal(results[r][key][0], g), (key, r)  # every rank decodes the same bytes
        if world // procs_per_node <= 2:  # rings of two: sums do not depend on the cut
            assert torch.equal(g, whole), key


def traced(rank, world, name):
    """Two steps of a 3-piece bucket with the tracer on: the spans, and the driver's times."""
    channel = Channel(dist.group.WORLD, world, "ring", Topology(world, rank, 1).groups(), piece_bytes=4000)
    tracer = Tracer(True)
    driver = BucketDriver(make_codec(name, CodecSettings(TopkOptions(density=0.1))), channel, tracer)
    params = [torch.randn(3000) + 2]
    view = driver.view(0, params, [0], 3000)
    times = []
    for step in range(2):
        pending = driver.prepare(torch.randn(3000, generator=torch.Generator().manual_seed(rank + step)), view)
        times.append(driver.complete(pending))
    return tracer.events, times


@pytest.mark.parametrize("name,pieces", [("fp8", 1), ("fp16", 2), ("fp32", 3), ("topk", 1)])
def test_every_codec_is_traced_alike_encode_wire_reduce_decode_and_its_times_add_up(name, pieces):
    events, times = run_workers(traced, 2, name)[0]
    names = {(e["name"], e["thread"]) for e in events}
    encode_lane = "backward" if name == "topk" else "comm"  # top-k selects on backward's path
    assert {("encode", encode_lane), ("reduce", "comm"), ("decode", "comm")} <= names
    wire = [e for e in events if e["name"] == "wire"]
    assert wire and all(e["thread"].startswith("wire ") for e in wire)
    assert {e["args"].get("piece") for e in wire} == set(range(pieces))
    for t in times:
        assert t.bytes_sent > 0 and t.codec_s > 0 and t.wire_s >= 0
        assert (t.encode_s > 0) == (name == "topk")  # encoding in backward is not the exchange's time
    comm = [e for e in events if e["thread"] == "comm"]
    assert sum(e["dur"] for e in comm) / 1e6 == pytest.approx(sum(t.codec_s for t in times), rel=1e-6)
