"""Compression that starts late: fp32 for the first steps, exact; then the codec; the count survives a resume."""

import torch
import torch.distributed as dist

from scalesgd.comm.codecs import BucketView, Channel, CodecSettings, DenseFirst, make_codec
from tests.spawn_util import run_workers


def exchanges(rank, world):
    params = [torch.zeros(1000)]
    view = BucketView(0, params, [0], 1000)
    channel = Channel(dist.group.WORLD, world)
    codec = make_codec("fp8-flat", CodecSettings(compress_after=3))
    gen = torch.Generator().manual_seed(rank)
    exact, resumed = [], None
    for step in range(5):
        g = torch.randn(1000, generator=gen)
        mean = g.clone()
        dist.all_reduce(mean)
        mean /= world
        out = g.clone()
        codec.exchange(out, view, channel)
        exact.append(torch.equal(out, mean))
        if step == 1:
            resumed = make_codec("fp8-flat", CodecSettings(compress_after=3))
            resumed.load_state_dict(codec.state_dict())
    return isinstance(codec, DenseFirst), exact, resumed.state_dict()["done"]


def test_the_first_steps_are_the_exact_mean_then_the_codec_compresses():
    for wrapped, exact, done in run_workers(exchanges, 2):
        assert wrapped and exact == [True, True, True, False, False]
        assert done == {0: 2}  # a resumed codec knows how many dense steps are behind it
    assert not isinstance(make_codec("fp8-flat", CodecSettings(compress_after=0)), DenseFirst)
