"""LAMB against the paper's Algorithm 2 written out per tensor, torch's Adam, its state, its lack of host syncs,
its argument checks, and `--optimizer lamb` through the recipe and the CLI."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.models import build_model
from scalesgd.optim import LAMB, OPTIMIZERS, lamb
from scalesgd.recipe import build_optimizer
from tests.train.cli import FAST, scalesgd

DEFAULTS = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0, "bias_correction": True}


def reference_step(w: torch.Tensor, g: torch.Tensor, state: dict, h: dict) -> torch.Tensor:
    """You et al. 2020, Algorithm 2 (φ the identity) for one tensor in float64; wd == 0: Adam's step.

    `state` holds m, v and t, updated here; returns the new weight.
    """
    beta1, beta2 = h["betas"]
    t = state["t"] = state.get("t", 0) + 1
    m = state["m"] = beta1 * state.get("m", torch.zeros_like(w)) + (1 - beta1) * g
    v = state["v"] = beta2 * state.get("v", torch.zeros_like(w)) + (1 - beta2) * g * g
    if h["bias_correction"]:
        m, v = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    r = m / (v.sqrt() + h["eps"])
    if h["weight_decay"] == 0:
        return w - h["lr"] * r
    u = r + h["weight_decay"] * w
    w_norm, u_norm = math.sqrt(float((w * w).sum())), math.sqrt(float((u * u).sum()))
    ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
    return w - h["lr"] * ratio * u


def make_groups(dtype, seed=0):
    """Three groups: decayed (with an all-zero weight, and a weight that never has a gradient); decay-free; and one
    that overrides lr, betas, eps and decay."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    decayed = [rand(8, 3, 3, 3), torch.zeros(5, 4, dtype=dtype), rand(6, 7), rand(10)]
    free = [rand(8), rand(8), rand(4)]
    overridden = [rand(4, 5, 1, 1), rand(12)]
    groups = [{"params": decayed, "weight_decay": 0.1},
              {"params": free, "weight_decay": 0.0},
              {"params": overridden, "weight_decay": 0.01, "lr": 0.05, "betas": (0.5, 0.9), "eps": 1e-3}]
    return [{**g, "params": [torch.nn.Parameter(p) for p in g["params"]]} for g in groups], gen


NO_GRAD = (0, 3)  # (group, index) of the weight that never has a gradient


def set_grads(groups: list, gen: torch.Generator, step: int) -> None:
    for gi, g in enumerate(groups):
        for i, p in enumerate(g["params"]):
            grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * (0.5 + step)
            p.grad = None if (gi, i) == NO_GRAD else grad


def run_both(dtype, steps: int, bias_correction: bool = True):
    """LAMB and the float64 reference after `steps` steps on the same gradients."""
    groups, gen = make_groups(dtype)
    opt = LAMB(groups, lr=0.01, bias_correction=bias_correction)
    hyper = [{**DEFAULTS, "bias_correction": bias_correction, **{k: v for k, v in g.items() if k != "params"}}
             for g in groups]
    ref = [[p.detach().double().clone() for p in g["params"]] for g in opt.param_groups]
    states = [[{} for _ in g["params"]] for g in opt.param_groups]
    for step in range(steps):
        set_grads(opt.param_groups, gen, step)
        for g, weights, group_states, h in zip(opt.param_groups, ref, states, hyper):
            for i, p in enumerate(g["params"]):
                if p.grad is not None:
                    weights[i] = reference_step(weights[i], p.grad.double(), group_states[i], h)
        opt.step()
    return opt, ref, states


@pytest.mark.parametrize("chunk_bytes", [lamb.CHUNK_BYTES, 256])
@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_lamb_follows_algorithm_2_per_tensor(dtype, rtol, bias_correction, chunk_bytes, monkeypatch):
    monkeypatch.setattr(lamb, "CHUNK_BYTES", chunk_bytes)  # 256 bytes: the update runs over several chunks
    opt, ref, states = run_both(dtype, steps=6, bias_correction=bias_correction)
    for g, weights, group_states in zip(opt.param_groups, ref, states):
        for p, w, s in zip(g["params"], weights, group_states):
            torch.testing.assert_close(p.detach().double(), w, rtol=rtol, atol=rtol * float(w.abs().max()))
            if not s:
                assert not opt.state[p]  # no gradient ever: no state, weight untouched
                continue
            assert float(opt.state[p]["step"]) == s["t"] == 6
            for key, ref_key in (("exp_avg", "m"), ("exp_avg_sq", "v")):
                torch.testing.assert_close(opt.state[p][key].double(), s[ref_key], rtol=rtol,
                                           atol=rtol * float(s[ref_key].abs().max()))


def test_zero_weight_takes_the_whole_step_and_a_missing_gradient_leaves_its_weight_alone():
    groups, gen = make_groups(torch.float64)
    before = [p.detach().clone() for p in groups[0]["params"]]
    opt = LAMB(groups, lr=0.01)
    set_grads(groups, gen, 0)
    g = groups[0]["params"][1].grad.clone()
    opt.step()
    # t = 1: m̂ = g, v̂ = g², so u = g/(|g| + eps) with no decay term on w = 0, and the ratio is 1
    torch.testing.assert_close(groups[0]["params"][1].detach(), -0.01 * g / (g.abs() + 1e-6), rtol=1e-12, atol=0)
    assert torch.equal(groups[0]["params"][3].detach(), before[3])


@pytest.mark.parametrize("betas, bias_correction", [((0.9, 0.999), True), ((0.0, 0.0), True), ((0.0, 0.0), False)])
def test_decay_free_groups_take_torch_adams_step(betas, bias_correction):
    """β = 0 leaves nothing to correct, so torch's Adam (always corrected) matches without the correction too."""
    groups, gen = make_groups(torch.float64)
    params = groups[1]["params"]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = LAMB(params, lr=0.01, betas=betas, bias_correction=bias_correction)
    adam = torch.optim.Adam(twins, lr=0.01, betas=betas, eps=1e-6)
    for _ in range(5):
        for p, q in zip(params, twins):
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            q.grad = p.grad.clone()
        opt.step()
        adam.step()
    for p, q in zip(params, twins):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)
        assert opt.state[p].keys() == adam.state[q].keys()


@st.composite
def problems(draw):
    shapes = draw(st.lists(st.lists(st.integers(1, 5), min_size=0, max_size=3), min_size=1, max_size=4))
    # lr <= 0.5: ‖w − lr·(‖w‖/‖u‖)·u‖ >= (1 − lr)·‖w‖, so no step cancels a weight to rounding noise (at lr = 1
    # one can, and whether the next step sees exactly 0, ratio 1, or 1e-16, ratio ~0, is then up to rounding)
    hyper = {"lr": draw(st.floats(0, 0.5)),
             "betas": (draw(st.sampled_from([0.0, 0.5, 0.9])), draw(st.sampled_from([0.0, 0.9, 0.999, 0.9999]))),
             "eps": draw(st.sampled_from([1e-8, 1e-6, 1e-3])),
             "weight_decay": draw(st.sampled_from([0.0, 1e-4, 1e-2, 0.5])),
             "bias_correction": draw(st.booleans())}
    zeros = draw(st.lists(st.sampled_from(["none", "weight", "grad"]), min_size=len(shapes), max_size=len(shapes)))
    return shapes, hyper, zeros, draw(st.integers(1, 4)), draw(st.integers(0, 2**31))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_lamb_matches_algorithm_2_on_random_problems(problem):
    shapes, hyper, zeros, steps, seed = problem
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64) if z == "weight"
                                 else torch.randn(s, generator=gen, dtype=torch.float64) * 3)
              for s, z in zip(shapes, zeros)]
    opt = LAMB(params, **hyper)
    ref, states = [p.detach().clone() for p in params], [{} for _ in params]
    for _ in range(steps):
        for i, (p, z) in enumerate(zip(params, zeros)):
            p.grad = torch.zeros_like(p) if z == "grad" else torch.randn(p.shape, generator=gen, dtype=torch.float64)
            ref[i] = reference_step(ref[i], p.grad, states[i], hyper)
        opt.step()
    for p, w in zip(params, ref):
        torch.testing.assert_close(p.detach(), w, rtol=1e-9, atol=1e-12)


def test_channels_last_weights_step_as_contiguous_ones_and_non_dense_ones_are_refused():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(4, 3, 3, 3, generator=gen, dtype=torch.float64)
    plain, last = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone().to(memory_format=torch.channels_last))
    opts = LAMB([plain], lr=0.01, weight_decay=0.1), LAMB([last], lr=0.01, weight_decay=0.1)
    for _ in range(3):
        g = torch.randn(w.shape, generator=gen, dtype=torch.float64)
        plain.grad, last.grad = g.clone(), g.clone().to(memory_format=torch.channels_last)
        for opt in opts:
            opt.step()
    torch.testing.assert_close(last.detach(), plain.detach(), rtol=1e-12, atol=1e-15)
    strided = torch.nn.Parameter(torch.randn(4, 6, dtype=torch.float64)[:, ::2])
    strided.grad = torch.ones_like(strided)
    with pytest.raises(ValueError, match="LAMB needs dense parameters"):
        LAMB([strided], lr=0.01).step()


def grads_for(groups: list, step: int) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for gi, g in enumerate(groups):
        for i, p in enumerate(g["params"]):
            p.grad = None if (gi, i) == NO_GRAD else torch.randn(p.shape, generator=gen)


def test_state_dict_round_trip_continues_like_an_uninterrupted_run():
    groups, _ = make_groups(torch.float32)
    straight = LAMB(groups, lr=0.01)
    for step in range(5):
        grads_for(straight.param_groups, step)
        straight.step()

    groups, _ = make_groups(torch.float32)
    first = LAMB(groups, lr=0.01)
    for step in range(2):
        grads_for(first.param_groups, step)
        first.step()
    saved = copy.deepcopy(first.state_dict())
    assert all(s.keys() == {"step", "exp_avg", "exp_avg_sq"} for s in saved["state"].values())

    groups, _ = make_groups(torch.float32)
    with torch.no_grad():
        for g, g_first in zip(groups, first.param_groups):
            for p, q in zip(g["params"], g_first["params"]):
                p.copy_(q)
    resumed = LAMB(groups, lr=0.01)
    resumed.load_state_dict(saved)
    for step in range(2, 5):
        grads_for(resumed.param_groups, step)
        resumed.step()
    for g_got, g_want in zip(resumed.param_groups, straight.param_groups):
        for p, q in zip(g_got["params"], g_want["params"]):
            assert torch.equal(p, q)


def test_a_deep_copy_steps_as_the_original():
    groups, _ = make_groups(torch.float32)
    opt = LAMB(groups, lr=0.01)
    grads_for(opt.param_groups, 0)
    opt.step()
    twin = copy.deepcopy(opt)  # torch pickles defaults, state and groups only: the scratch buffer is rebuilt
    for o in (opt, twin):
        grads_for(o.param_groups, 1)
        o.step()
    for g, h in zip(opt.param_groups, twin.param_groups):
        for p, q in zip(g["params"], h["params"]):
            assert torch.equal(p, q) and p is not q


def test_step_runs_the_closure_and_returns_its_loss():
    w = torch.nn.Parameter(torch.tensor([3.0, -4.0], dtype=torch.float64))
    opt = LAMB([w], lr=0.5, weight_decay=0.1)

    def closure():
        opt.zero_grad()
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 25.0
    expected = reference_step(torch.tensor([3.0, -4.0], dtype=torch.float64),
                              torch.tensor([6.0, -8.0], dtype=torch.float64), {}, {**DEFAULTS, "lr": 0.5,
                                                                                   "weight_decay": 0.1})
    torch.testing.assert_close(w.detach(), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("bias_correction", [True, False])
def test_lamb_step_reads_no_tensor_value_on_the_host(no_host_sync, bias_correction):
    def run(patched: bool) -> LAMB:
        groups, _ = make_groups(torch.float32)
        opt = LAMB(groups, lr=0.01, bias_correction=bias_correction)
        grads = []
        for step in range(3):
            grads_for(opt.param_groups, step)
            grads.append([p.grad for g in opt.param_groups for p in g["params"]])
        if patched:
            no_host_sync()
        for step_grads in grads:
            for p, grad in zip([p for g in opt.param_groups for p in g["params"]], step_grads):
                p.grad = grad
            opt.step()
        return opt

    expected = run(patched=False)
    got = run(patched=True)
    for g_got, g_want in zip(got.param_groups, expected.param_groups):
        for p, q in zip(g_got["params"], g_want["params"]):
            assert torch.equal(p, q)


def test_torch_adam_does_read_its_step_on_the_host_so_the_check_has_teeth(no_host_sync):
    w = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.Adam([w], lr=0.01)  # its CPU step count is read with .item() for the bias correction
    w.grad = torch.ones(3)
    no_host_sync()
    with pytest.raises(AssertionError, match="host synchronisation"):
        adam.step()


@pytest.mark.parametrize("kwargs, bad", [
    ({"lr": -0.1}, "lr -0.1"),
    ({"lr": float("nan")}, "lr nan"),
    ({"betas": (1.0, 0.999)}, "beta1 1.0"),
    ({"betas": (-0.1, 0.999)}, "beta1 -0.1"),
    ({"betas": (0.9, 1.0)}, "beta2 1.0"),
    ({"betas": (0.9, float("nan"))}, "beta2 nan"),
    ({"betas": (0.9,)}, r"betas \(0.9,\)"),
    ({"eps": 0.0}, "eps 0.0"),
    ({"eps": -1e-8}, "eps -1e-08"),
    ({"weight_decay": -1e-4}, "weight_decay -0.0001"),
])
def test_constructor_rejects_bad_values_naming_them(kwargs, bad):
    with pytest.raises(ValueError, match=f"invalid {bad}"):
        LAMB([torch.nn.Parameter(torch.ones(2))], **{"lr": 0.1, **kwargs})


def test_a_group_override_is_checked_too():
    with pytest.raises(ValueError, match="invalid beta2 1.5"):
        LAMB([{"params": [torch.nn.Parameter(torch.ones(2))], "betas": (0.9, 1.5)}], lr=0.1)


def test_sparse_gradients_are_refused_by_name():
    w = torch.nn.Parameter(torch.ones(3))
    w.grad = torch.ones(3).to_sparse()
    with pytest.raises(RuntimeError, match="LAMB does not support sparse gradients"):
        LAMB([w], lr=0.1).step()


def test_the_registry_and_the_recipe_build_lamb_on_the_recipes_groups():
    model = build_model("resnet8", 10, 1)
    opt = build_optimizer(model, "lamb", lr=0.02, momentum=0.5, nesterov=True, weight_decay=1e-4,
                          trust_coefficient=0.3)
    assert isinstance(opt, LAMB) and "lamb" in OPTIMIZERS
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]  # BN γ/β take plain Adam steps
    assert all(g["betas"] == (0.9, 0.999) and g["lr"] == 0.02 for g in opt.param_groups)  # momentum not β1


def test_train_config_takes_lamb_and_refuses_nesterov_with_it():
    assert TrainConfig.of(optimizer="lamb").validate().recipe.optimizer == "lamb"
    with pytest.raises(UsageError, match="`nesterov` is momentum SGD's"):
        TrainConfig.of(optimizer="lamb", nesterov=True).validate()


def test_train_offers_lamb_and_two_workers_train_with_it_for_an_epoch(tmp_path):
    help_text = scalesgd("train", "--help").stdout
    assert "sgd | lars | lamb" in help_text and "lamb ignores it" in help_text
    run = tmp_path / "lamb"
    # LAMB's relative steps want a rate well below SGD's: a peak of 0.04 here (0.01 × 128/32), kept all epoch
    proc = scalesgd("train", "--workers", "2", "--epochs", "1", "--optimizer", "lamb", "--base-lr", "0.01",
                    "--warmup", "none", "--milestones", "1", "--run-dir", str(run), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "config.json").read_text())["optimizer"] == "lamb"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    iters = [r for r in records if r["kind"] == "iter"]
    epoch = [r for r in records if r["kind"] == "epoch"][-1]
    assert len(iters) == 12 and iters[-1]["loss"] < iters[0]["loss"] - 0.2  # 2.30 → 1.91 when written
    assert epoch["test_acc"] > 0.3  # well above chance (0.1) after one epoch; 0.57 when written


@pytest.mark.cuda
def test_lamb_on_cuda_matches_cpu_and_never_synchronises():
    groups, _ = make_groups(torch.float32)
    on_gpu = [{**g, "params": [torch.nn.Parameter(p.detach().cuda()) for p in g["params"]]} for g in groups]
    cpu, gpu = LAMB(groups, lr=0.01), LAMB(on_gpu, lr=0.01)
    for step in range(3):
        grads_for(cpu.param_groups, step)
        for g, h in zip(cpu.param_groups, gpu.param_groups):
            for p, q in zip(g["params"], h["params"]):
                q.grad = None if p.grad is None else p.grad.cuda()
        cpu.step()
        torch.cuda.set_sync_debug_mode("error")  # any device-to-host wait raises
        try:
            gpu.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for g, h in zip(cpu.param_groups, gpu.param_groups):
        for p, q in zip(g["params"], h["params"]):
            torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)
            assert not gpu.state[q] or gpu.state[q]["step"].is_cuda
