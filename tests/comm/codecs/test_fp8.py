"""The fp8 codec (SPEC §2): its sampled ranges, its settings and its state."""

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.codecs import BucketView, Channel, CodecSettings, Fp8Options, make_codec
from scalesgd.comm.codecs.fp8 import sample_quantiles
from scalesgd.comm.topology import Topology
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
    assert Fp8Options().problems() == {}
    assert Fp8Options(eps=0, quantile=1.5, period=0, samples=0).problems() == {
        "eps": "must be a positive number", "quantile": "must be in (0, 1]",
        "period": "must be >= 1 (steps)", "samples": "must be >= 1"}
    with pytest.raises(ValueError, match="fp8 quantile 0: must be in"):
        make_codec("fp8", CodecSettings(Fp8Options(quantile=0)))


def state_round_trip(rank, world):
    groups = Topology(1, 0, 1).groups()
    channel = Channel(dist.group.WORLD, 1, "ring", groups)
    params = [torch.randn(3000), torch.randn(50)]
    view = BucketView(0, params, [0, 3000], 3050)
    opts = Fp8Options(period=2, samples=100)
    first, second = (make_codec("fp8", CodecSettings(opts, seed=1)) for _ in range(2))
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(3050, generator=gen) * (1 + i) for i in range(5)]
    for g in grads[:3]:
        first.encode(g.clone(), view, channel)
    second.load_state_dict(first.state_dict())
    return [torch.equal(first.encode(g.clone(), view, channel), second.encode(g.clone(), view, channel))
            for g in grads[3:]], [t["step"] for t in first.state_dict()["tensors"].values()]


def test_codec_state_restores_ranges_step_and_sampling():
    same, steps = run_workers(state_round_trip, 1)[0]
    assert same == [True, True]  # the 5th encode re-measures (period 2): same samples after the restore
    assert steps == [5, 5]
