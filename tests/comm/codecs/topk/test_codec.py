import math

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.codecs import BucketView, Channel, CodecSettings, DgcOptions, TopkOptions, make_codec
from scalesgd.comm.codecs.topk.codec import TopkCodec
from scalesgd.comm.engine.optimizer import DistributedOptimizer
from scalesgd.errors import UsageError
from scalesgd.models import build_model
from scalesgd.recipe import build_optimizer
from tests.comm.exchanging import exchange, view_of
from tests.spawn_util import run_workers

VIEW = BucketView(0, [], [0], 5000)


def kept(codec: TopkCodec, name: str = "residual") -> tuple[torch.Tensor, float | None]:
    """What the codec keeps for VIEW (a bucket of no parameters: one region) and its threshold; zeros and None
    before its first step."""
    state = codec.state_dict()
    regions, thresholds = state["flat"]["regions"], state["thresholds"]
    return (regions[0][name] if regions else torch.zeros(5000)), (thresholds[0]["threshold"] if thresholds else None)


def grads(steps, n=5000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) * (1 + i) for i in range(steps)]


@pytest.mark.parametrize("wire", ["compact", "plain"])
def test_residuals_are_conserved_sent_plus_kept_equals_accumulated(wire):
    codec = TopkCodec("topk", density=0.05, reuse=3, wire=wire)
    residual = torch.zeros(5000)
    for g in grads(7):
        accumulated = residual + g
        idx, values, _ = codec.sparsify(g.clone(), VIEW, 1)
        kept_now = kept(codec)[0]
        sent = torch.zeros(5000).index_put_((idx.long(),), values)
        assert torch.equal(sent + kept_now, accumulated)
        if wire == "plain":
            assert torch.all(kept_now[idx.long()] == 0)
        else:  # fp16 carries the value; only its rounding, under half an fp16 step, stays behind
            assert torch.equal(values, values.half().float())
            assert torch.all(kept_now[idx.long()].abs() <= values.abs() * 2.0 ** -11)
        residual = kept_now.clone()


def test_at_recompute_steps_the_threshold_selects_exactly_the_top_k():
    codec = TopkCodec("topk", density=0.01, reuse=4)
    k = math.ceil(0.01 * 5000)
    for step, g in enumerate(grads(9)):
        before = kept(codec)[0]
        idx = codec.sparsify(g.clone(), VIEW, 1)[0]
        accumulated = (before + g).abs()
        threshold = kept(codec)[1]
        by_threshold = set(torch.nonzero(accumulated >= threshold).view(-1).tolist())
        if step % 4 == 0:  # recompute: exactly k, and the threshold alone picks the same set
            assert len(idx) == k
            assert set(idx.tolist()) == set(torch.topk(accumulated, k).indices.tolist()) == by_threshold
        else:  # reuse: everything at or above the last exact threshold
            assert set(idx.tolist()) == by_threshold


@pytest.mark.parametrize("growth", [1.0, -0.9], ids=["growing", "shrinking"])
def test_a_reused_threshold_sends_between_half_and_twice_k(growth):
    """Gradients that grow (shrink) each step make the last exact threshold let ever more (fewer) through:
    outside k/2…2k the exact top-k is taken again, so the bytes stay within 2× of the density's."""
    codec = TopkCodec("topk", density=0.01, reuse=100)
    k = math.ceil(0.01 * 5000)
    g = torch.Generator().manual_seed(0)
    sent, retaken = [], 0
    for step in range(8):
        grad = torch.randn(5000, generator=g) * (1 + growth * step / 8) ** 4
        before, old = kept(codec)
        idx = codec.sparsify(grad.clone(), VIEW, 1)[0]
        sent.append(len(idx))
        passed = int(((before + grad).abs() >= old).sum()) if old else k
        if not k / 2 <= passed <= 2 * k:  # the reused threshold would have sent too much or too little
            retaken += 1
            assert len(idx) == k and kept(codec)[1] != old
        else:
            assert len(idx) == passed
    assert k / 2 <= min(sent) and max(sent) <= 2 * k and retaken >= 2


def test_state_round_trip_continues_identically():
    first, second = TopkCodec("topk", 0.1, 3), TopkCodec("topk", 0.1, 3)
    steps = grads(6)
    for g in steps[:4]:
        first.sparsify(g.clone(), VIEW, 1)
    second.load_state_dict(first.state_dict())
    for g in steps[4:]:
        a, b = first.sparsify(g.clone(), VIEW, 1), second.sparsify(g.clone(), VIEW, 1)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_bad_settings_are_named_as_the_command_line_names_them():
    with pytest.raises(UsageError, match=r"^`density` 0: must be in \(0, 1\]$"):
        make_codec("topk", CodecSettings(TopkOptions(density=0)))
    with pytest.raises(UsageError, match=r"^`topk_reuse` 0: must be >= 1"):
        make_codec("lags", CodecSettings(TopkOptions(reuse=0)))  # checked for every codec of the family


def engine_grads(rank, world, codec, density, wire="compact"):
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
    buckets = {"topk": "size:0.01", "topk-global": "single", "lags": "layer"}[codec]
    engine = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                  codec=make_codec(codec, CodecSettings(TopkOptions(density, reuse=2, wire=wire))),
                                  buckets=buckets)
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
    for out, ref in run_workers(engine_grads, 2, "topk", 1.0, "plain"):
        assert torch.allclose(out, ref, atol=1e-6)
    for out, ref in run_workers(engine_grads, 2, "topk", 1.0):  # compact: each rank's value in fp16
        assert (out - ref).norm() <= 2 ** -10 * ref.norm()  # two roundings of 2^-12 at most, relative


def test_density_warms_up_exponentially_over_epochs_as_dgc_does():
    dgc = DgcOptions(warmup_epochs=4, steps_per_epoch=10)
    densities = [dgc.density_at(0.001, step) for step in (0, 9, 10, 20, 30, 39, 40, 1000)]
    coeff = 0.001 ** (1 / 5)
    assert densities == pytest.approx([coeff, coeff, coeff ** 2, coeff ** 3, coeff ** 4, coeff ** 4, 0.001, 0.001])
    assert densities[0] == pytest.approx(0.2512, abs=1e-4)  # DGC's 25 %, 6.25 %, 1.6 %, 0.4 %, then 0.1 %
    assert DgcOptions().density_at(0.01, 0) == 0.01


def test_momentum_correction_accumulates_the_velocity_and_masks_what_is_sent():
    m = 0.9
    codec = TopkCodec("topk", density=0.01, reuse=1, dgc=DgcOptions(momentum=m), wire="plain")
    u, v = torch.zeros(5000), torch.zeros(5000)
    for g in grads(4):
        u = m * u + g
        v = v + u
        idx, values, _ = codec.sparsify(g.clone(), VIEW, 1)
        idx = idx.long()
        assert torch.allclose(values, v[idx]) and len(idx) == 50  # the top 1 % of the velocity
        assert torch.equal(idx.sort().values, v.abs().topk(50).indices.sort().values)
        v[idx], u[idx] = 0, 0  # sent: out of the residual, and its momentum masked
        assert torch.allclose(kept(codec)[0], v) and torch.allclose(kept(codec, "momentum")[0], u)


def test_local_clipping_bounds_each_tensors_norm_before_it_accumulates():
    params = [torch.zeros(3000), torch.zeros(2000)]
    view = view_of(params)
    codec = TopkCodec("topk", density=1.0, reuse=1, dgc=DgcOptions(clip=2.0))
    g = grads(1)[0] * 100
    idx, values, _ = codec.sparsify(g.clone(), view, 4)  # 4 ranks: each tensor clipped to 2 / √4 = 1
    sent = torch.zeros(5000).index_put_((idx.long(),), values)
    assert sent[:3000].norm() == pytest.approx(1.0, rel=1e-4) and sent[3000:].norm() == pytest.approx(1.0, rel=1e-4)


def trained(model, engine, rank, steps):
    """`steps` steps of this rank's random batches through `engine`; the model's parameters, flat, after them."""
    for step in range(steps):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        engine.step()
        engine.zero_grad()
    engine.close()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def dgc_at_full_density(rank, world, correction):
    """Five steps at density 1 with weight decay 0: with momentum correction every entry is sent and its momentum
    masked each step, so the run is SGD without momentum; without it, the optimizer's momentum acts."""
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    settings = CodecSettings(TopkOptions(density=1.0, reuse=1, momentum_correction=correction, wire="plain"),
                             momentum=0.9)
    optimizer = build_optimizer(model, "sgd", 0.05, 0.9, False, 0.0, momentum_in_exchange=correction)
    engine = DistributedOptimizer(optimizer, model, codec=make_codec("topk", settings), buckets="single")
    return trained(model, engine, rank, 5)


def plain_sgd(rank, world, momentum):
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)
    for step in range(5):
        g = torch.Generator().manual_seed(10 * step + rank)
        x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        optimizer.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_with_momentum_correction_the_optimizer_does_not_apply_momentum_again():
    corrected = run_workers(dgc_at_full_density, 2, True)[0]
    uncorrected = run_workers(dgc_at_full_density, 2, False)[0]
    assert torch.allclose(corrected, run_workers(plain_sgd, 2, 0.0)[0], atol=1e-5)
    assert torch.allclose(uncorrected, run_workers(plain_sgd, 2, 0.9)[0], atol=1e-5)
    assert not torch.allclose(corrected, uncorrected, atol=1e-3)


def flagged(rank, world):
    codec = TopkCodec("topk", density=0.1, reuse=1)
    g = grads(1, seed=rank)[0]
    if rank == 0:
        g[7] = float("nan")
    out = g.clone()
    exchange(codec, out, VIEW, Channel(dist.group.WORLD, world))
    return bool(torch.isnan(out).all()), kept(codec)[0].abs().sum().item()


def test_a_non_finite_gradient_sends_nothing_keeps_the_residual_and_poisons_the_mean_everywhere():
    (all_nan_0, residual_0), (all_nan_1, residual_1) = run_workers(flagged, 2)
    assert all_nan_0 and all_nan_1
    assert residual_0 == 0 and residual_1 > 0  # rank 0 kept its (empty) residual; rank 1 accumulated as usual


def adam_with_momentum_in_the_exchange(rank, world, correction):
    """Three dense steps, then five at density 1: with Adam's momentum carried by the exchange (never masked under
    Adam) the run is AdamW with its variance frozen after the dense steps, as a dense exchange of the gradient gives."""
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    options = TopkOptions(density=1.0, reuse=1, momentum_correction=correction, wire="plain")
    settings = CodecSettings(options, momentum=0.9, momentum_average=True)
    optimizer = build_optimizer(model, "adamw", 0.01, 0.0, False, 0.0, momentum_in_exchange=correction,
                                betas=(0.9, 0.99), freeze_step=3, freeze_variance=not correction)
    engine = DistributedOptimizer(optimizer, model, codec=make_codec("topk", settings) if correction else "fp32",
                                  buckets="single", compress_after=3)
    return trained(model, engine, rank, 8)


def test_adams_momentum_in_the_exchange_is_adamw_with_its_variance_frozen():
    carried = run_workers(adam_with_momentum_in_the_exchange, 2, True)[0]
    frozen = run_workers(adam_with_momentum_in_the_exchange, 2, False)[0]
    assert torch.allclose(carried, frozen, atol=1e-5)


def test_a_state_saved_by_bucket_index_loads_by_parameter():
    """A checkpoint from before state was kept by parameter: each bucket's keys say whose residual is whose."""
    residual, momentum = torch.arange(5.0), -torch.arange(5.0)
    old = {"buckets": {3: {"residual": residual, "momentum": momentum, "threshold": 0.5, "density": 0.1, "step": 7,
                           "keys": [4, 2], "sizes": [3, 2]}}}
    codec = TopkCodec("topk", density=0.1, dgc=DgcOptions(momentum=0.9))
    codec.load_state_dict(old)
    state = codec.state_dict()
    assert torch.equal(state["flat"]["params"][4]["residual"], residual[:3])
    assert torch.equal(state["flat"]["params"][2]["momentum"], momentum[3:])
    assert state["thresholds"] == [{"keys": [4, 2], "threshold": 0.5, "density": 0.1, "step": 7}]
    params = [torch.zeros(3), torch.zeros(2)]
    view = BucketView(0, params, [0, 3], 5, (4, 2))  # the same parameters, under another index now
    held, st = codec._bucket(view, torch.zeros(5))
    assert torch.equal(held.tensors["residual"], residual) and st.step == 7
