"""LARS against the formula written out per tensor, its baseline twin, its state and its lack of host syncs."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.optim import LARS, NaiveLARS, lars

DEFAULTS = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0, "trust_coefficient": 0.001, "eps": 1e-8,
            "nesterov": False}


def reference_step(weights: list, grads: list, bufs: list, h: dict) -> None:
    """The LARS formula one tensor at a time, in place on the lists; None gradients are skipped."""
    for i, (w, g) in enumerate(zip(weights, grads)):
        if g is None:
            continue
        wd = h["weight_decay"]
        if wd > 0:
            w_norm, g_norm = math.sqrt(float((w * w).sum())), math.sqrt(float((g * g).sum()))
            rho = h["trust_coefficient"] * w_norm / (g_norm + wd * w_norm + h["eps"]) if w_norm and g_norm else 1.0
            d = (g + wd * w) * rho
        else:
            d = g
        if h["momentum"]:
            bufs[i] = d.clone() if bufs[i] is None else h["momentum"] * bufs[i] + d
            update = d + h["momentum"] * bufs[i] if h["nesterov"] else bufs[i]
        else:
            update = d
        weights[i] = w - h["lr"] * update


def make_groups(dtype, seed=0):
    """Three groups: decayed with a zero weight, a zero grad and a None grad; decay-free; and overridden."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    decayed = [rand(8, 3, 3, 3), torch.zeros(5, 4, dtype=dtype), rand(6, 7), rand(10), rand(3, 3)]
    free = [rand(8), rand(8), rand(4)]
    overridden = [rand(4, 5, 1, 1), rand(12)]
    groups = [{"params": decayed, "weight_decay": 1e-4},
              {"params": free, "weight_decay": 0.0},
              {"params": overridden, "weight_decay": 5e-3, "trust_coefficient": 0.02, "lr": 0.3}]
    params = [torch.nn.Parameter(p) for g in groups for p in g["params"]]
    it = iter(params)
    groups = [{**g, "params": [next(it) for _ in g["params"]]} for g in groups]
    return groups, params, gen


def set_grads(params: list, gen: torch.Generator, step: int) -> None:
    """Fresh random gradients; params[2] always has a zero gradient and params[4] never has one."""
    for i, p in enumerate(params):
        g = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * (0.5 + step)
        p.grad = None if i == 4 else (torch.zeros_like(p) if i == 2 else g)


def run_both(opt_class, dtype, steps: int, **kwargs):
    """The optimizer and the float64 reference after `steps` steps on the same gradients."""
    groups, params, gen = make_groups(dtype)
    opt = opt_class(groups, lr=0.1, momentum=kwargs.pop("momentum", 0.9), **kwargs)
    hyper = [{**DEFAULTS, **{k: v for k, v in g.items() if k != "params"}} for g in opt.param_groups]
    ref = [[p.detach().double().clone() for p in g["params"]] for g in opt.param_groups]
    ref_bufs = [[None] * len(g["params"]) for g in opt.param_groups]
    for step in range(steps):
        set_grads(params, gen, step)
        for g, weights, bufs, h in zip(opt.param_groups, ref, ref_bufs, hyper):
            reference_step(weights, [None if p.grad is None else p.grad.double() for p in g["params"]], bufs, h)
        opt.step()
    return opt, ref, ref_bufs


def assert_matches(opt, ref, ref_bufs, rtol=1e-6):
    for g, weights, bufs in zip(opt.param_groups, ref, ref_bufs):
        for p, w, buf in zip(g["params"], weights, bufs):
            atol = rtol * float(w.abs().max()) if w.numel() else 0.0  # near-zero entries after cancellation
            torch.testing.assert_close(p.detach().double(), w, rtol=rtol, atol=atol)
            if buf is None:
                assert "momentum_buffer" not in opt.state[p]
            else:
                torch.testing.assert_close(opt.state[p]["momentum_buffer"].double(), buf, rtol=rtol,
                                           atol=rtol * float(buf.abs().max()))


@pytest.mark.parametrize("chunk_bytes", [lars.CHUNK_BYTES, 256])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lars_follows_the_formula_per_tensor(nesterov, dtype, chunk_bytes, monkeypatch):
    monkeypatch.setattr(lars, "CHUNK_BYTES", chunk_bytes)  # 256 bytes: the update runs over several chunks
    opt, ref, ref_bufs = run_both(LARS, dtype, steps=5, nesterov=nesterov)
    assert_matches(opt, ref, ref_bufs)


def test_cache_chunks_cover_every_tensor_once_in_order_within_the_budget(monkeypatch):
    monkeypatch.setattr(lars, "CHUNK_BYTES", 100)
    params = [torch.zeros(n) for n in (10, 10, 5, 40, 1, 1, 30)]  # 4 bytes per element
    parts = lars._cache_chunks(params)
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 4), (4, 6), (6, 7)]


def test_lars_without_momentum_keeps_no_buffer():
    opt, ref, ref_bufs = run_both(LARS, torch.float32, steps=3, momentum=0.0)
    assert_matches(opt, ref, ref_bufs)
    assert not any(opt.state[p] for g in opt.param_groups for p in g["params"])


def test_decay_free_group_takes_plain_momentum_sgd_steps():
    groups, params, gen = make_groups(torch.float64)
    free = [p.detach().clone() for p in groups[1]["params"]]
    opt = LARS(groups, lr=0.1, momentum=0.9)
    set_grads(params, gen, 0)
    grads = [p.grad.clone() for p in groups[1]["params"]]
    opt.step()
    for p, w, g in zip(groups[1]["params"], free, grads):
        torch.testing.assert_close(p.detach(), w - 0.1 * g, rtol=1e-12, atol=1e-12)


def test_zero_weight_and_zero_grad_get_trust_ratio_one_and_none_grad_is_untouched():
    groups, params, gen = make_groups(torch.float64)
    before = [p.detach().clone() for p in params]
    opt = LARS(groups, lr=0.1, momentum=0.0)
    set_grads(params, gen, 0)
    zero_weight_grad = params[1].grad.clone()
    opt.step()
    # ρ = 1: the zero weight moves by the whole rate times its gradient (its decay term is 0)
    torch.testing.assert_close(params[1].detach(), -0.1 * zero_weight_grad, rtol=1e-12, atol=0)
    # ρ = 1 with a zero gradient: only decay, w·(1 − lr·wd)
    torch.testing.assert_close(params[2].detach(), before[2] * (1 - 0.1 * 1e-4), rtol=1e-12, atol=0)
    assert torch.equal(params[4].detach(), before[4]) and not opt.state[params[4]]


@pytest.mark.parametrize("nesterov", [False, True])
def test_naive_lars_equals_lars(nesterov):
    batched, _, _ = run_both(LARS, torch.float32, steps=4, nesterov=nesterov)
    naive, _, _ = run_both(NaiveLARS, torch.float32, steps=4, nesterov=nesterov)
    for gb, gn in zip(batched.param_groups, naive.param_groups):
        for pb, pn in zip(gb["params"], gn["params"]):
            torch.testing.assert_close(pb, pn, rtol=1e-6, atol=1e-7)
            assert batched.state[pb].keys() == naive.state[pn].keys()


@st.composite
def problems(draw):
    shapes = draw(st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=3), min_size=1, max_size=4))
    momentum = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99]))
    hyper = {"lr": draw(st.floats(0, 2)), "momentum": momentum,
             "weight_decay": draw(st.sampled_from([0.0, 1e-5, 1e-4, 1e-2])),
             "trust_coefficient": draw(st.floats(1e-4, 1)), "eps": draw(st.sampled_from([0.0, 1e-8, 1e-3])),
             "nesterov": momentum > 0 and draw(st.booleans())}
    zeros = draw(st.lists(st.sampled_from(["none", "weight", "grad"]), min_size=len(shapes), max_size=len(shapes)))
    return shapes, hyper, zeros, draw(st.integers(1, 3)), draw(st.integers(0, 2**31))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_lars_matches_formula_on_random_problems(problem):
    shapes, hyper, zeros, steps, seed = problem
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64) if z == "weight"
                                 else torch.randn(s, generator=gen, dtype=torch.float64) * 3)
              for s, z in zip(shapes, zeros)]
    opt = LARS(params, **hyper)
    ref, bufs = [p.detach().clone() for p in params], [None] * len(params)
    for _ in range(steps):
        for p, z in zip(params, zeros):
            p.grad = torch.zeros_like(p) if z == "grad" else torch.randn(p.shape, generator=gen, dtype=torch.float64)
        reference_step(ref, [p.grad for p in params], bufs, hyper)
        opt.step()
    for p, w in zip(params, ref):
        torch.testing.assert_close(p.detach(), w, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("nesterov", [False, True])
def test_state_dict_round_trip_continues_like_an_uninterrupted_run(nesterov):
    def grads_for(params, step):
        gen = torch.Generator().manual_seed(100 + step)
        for i, p in enumerate(params):
            p.grad = None if i == 4 else torch.randn(p.shape, generator=gen)

    groups, params, _ = make_groups(torch.float32)
    start = [p.detach().clone() for p in params]
    straight = LARS(groups, lr=0.1, nesterov=nesterov)
    for step in range(5):
        grads_for(params, step)
        straight.step()

    groups, first, _ = make_groups(torch.float32)
    opt = LARS(groups, lr=0.1, nesterov=nesterov)
    for step in range(2):
        grads_for(first, step)
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    assert all("momentum_buffer" in s for s in saved["state"].values()) and len(saved["state"]) == len(first) - 1

    groups, resumed, _ = make_groups(torch.float32)
    assert all(torch.equal(p, s) for p, s in zip(resumed, start))
    with torch.no_grad():
        for p, q in zip(resumed, first):
            p.copy_(q)
    opt = LARS(groups, lr=0.1, nesterov=nesterov)
    opt.load_state_dict(saved)
    for step in range(2, 5):
        grads_for(resumed, step)
        opt.step()
    for p, q in zip(resumed, params):
        assert torch.equal(p, q)


def test_step_runs_the_closure_and_returns_its_loss():
    w = torch.nn.Parameter(torch.tensor([3.0, -4.0], dtype=torch.float64))
    opt = LARS([w], lr=0.5, momentum=0.0, weight_decay=0.1, trust_coefficient=0.01)

    def closure():
        opt.zero_grad()
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == 25.0
    expected = [torch.tensor([3.0, -4.0], dtype=torch.float64)]
    reference_step(expected, [torch.tensor([6.0, -8.0], dtype=torch.float64)], [None],
                   {**DEFAULTS, "lr": 0.5, "momentum": 0.0, "weight_decay": 0.1, "trust_coefficient": 0.01})
    torch.testing.assert_close(w.detach(), expected[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_step_reads_no_tensor_value_on_the_host(no_host_sync, nesterov):
    expected, _, _ = run_both(LARS, torch.float32, steps=3, nesterov=nesterov)
    groups, params, gen = make_groups(torch.float32)
    opt = LARS(groups, lr=0.1, nesterov=nesterov)
    grads = []
    for step in range(3):
        set_grads(params, gen, step)
        grads.append([p.grad for p in params])
    no_host_sync()
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g
        opt.step()
    for g_got, g_want in zip(opt.param_groups, expected.param_groups):
        for p, q in zip(g_got["params"], g_want["params"]):
            assert torch.equal(p, q)


def test_naive_lars_does_read_values_on_the_host_so_the_check_has_teeth(no_host_sync):
    groups, params, gen = make_groups(torch.float32)
    opt = NaiveLARS(groups, lr=0.1)
    set_grads(params, gen, 0)
    no_host_sync()
    with pytest.raises(AssertionError, match="host synchronisation"):
        opt.step()


@pytest.mark.parametrize("kwargs, bad", [
    ({"lr": -0.1}, "lr -0.1"),
    ({"lr": float("nan")}, "lr nan"),
    ({"momentum": 1.0}, "momentum 1.0"),
    ({"momentum": -0.5}, "momentum -0.5"),
    ({"weight_decay": -1e-4}, "weight_decay -0.0001"),
    ({"trust_coefficient": 0.0}, "trust_coefficient 0.0"),
    ({"eps": -1e-8}, "eps -1e-08"),
    ({"nesterov": True, "momentum": 0.0}, "momentum 0.0"),
])
@pytest.mark.parametrize("opt_class", [LARS, NaiveLARS])
def test_constructor_rejects_bad_values_naming_them(opt_class, kwargs, bad):
    with pytest.raises(ValueError, match=f"invalid .*{bad}"):
        opt_class([torch.nn.Parameter(torch.ones(2))], **{"lr": 0.1, **kwargs})


def test_a_group_override_is_checked_too():
    with pytest.raises(ValueError, match="invalid weight_decay -1"):
        LARS([{"params": [torch.nn.Parameter(torch.ones(2))], "weight_decay": -1}], lr=0.1)
