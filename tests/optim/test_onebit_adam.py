"""OneBitAdam: torch's AdamW bit for bit up to the freeze; after it, `.grad` taken as the momentum with the
variance frozen, as a float64 computation of the same formula; its state round-trips; bad arguments refused."""

import copy
import warnings

import pytest
import torch

from scalesgd.optim.onebit_adam import EarlyFreezeWarning, OneBitAdam, variance_horizon

SHAPES = [(7, 5), (5,), (3, 2, 2)]
HYPER = {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}
# these short runs freeze Adam's variance early on purpose
pytestmark = pytest.mark.filterwarnings("ignore::scalesgd.optim.EarlyFreezeWarning")


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).requires_grad_() for shape in SHAPES]


def grads(step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(*shape, generator=g) for shape in SHAPES]


def run(optimizer, ps, steps, start=0):
    for step in range(start, start + steps):
        for p, grad in zip(ps, grads(step)):
            p.grad = grad.clone()
        optimizer.step()


def test_before_the_freeze_it_is_torch_adamw_bit_for_bit():
    ours, theirs = params(), params()
    run(OneBitAdam(ours, freeze_step=6, **HYPER), ours, 6)
    run(torch.optim.AdamW(theirs, **HYPER), theirs, 6)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def reference(j: int, n: int, steps: int, grad_is_momentum: bool):
    """Parameter j after `steps` steps in float64, and its m and v: AdamW for the first n, then v frozen, and the
    incoming gradient either the averaged momentum itself or folded into Adam's m as before."""
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    w, m, v = params()[j].detach().double(), 0.0, 0.0
    for t in range(1, steps + 1):
        g = grads(t - 1)[j].double()
        m = g if grad_is_momentum and t > n else b1 * m + (1 - b1) * g
        if t <= n:
            v = b2 * v + (1 - b2) * g * g
        v_hat = v / (1 - b2 ** min(t, n))  # after the freeze: v at step n, corrected for step n
        w = w * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / (v_hat.sqrt() + eps)
    return w, m, v


def test_after_the_freeze_grad_is_the_momentum_and_the_variance_stays():
    ps, n, steps = params(), 3, 7
    optimizer = OneBitAdam(ps, freeze_step=n, **HYPER)
    run(optimizer, ps, steps)
    for j in range(len(ps)):
        w, _, v = reference(j, n, steps, grad_is_momentum=True)
        state = optimizer.state[ps[j]]
        assert torch.allclose(ps[j].detach().double(), w, atol=1e-6, rtol=0)
        assert torch.equal(state["exp_avg"], grads(steps - 1)[j])
        assert torch.allclose(state["exp_avg_sq"].double(), v, rtol=1e-6, atol=0)
        assert state["step"].item() == steps


def test_with_gradients_after_the_freeze_it_is_adamw_with_its_variance_frozen():
    ps, n, steps = params(), 3, 7
    optimizer = OneBitAdam(ps, freeze_step=n, grad_is_momentum=False, **HYPER)
    run(optimizer, ps, steps)
    for j in range(len(ps)):
        w, m, _ = reference(j, n, steps, grad_is_momentum=False)
        assert torch.allclose(ps[j].detach().double(), w, atol=1e-6, rtol=0)
        assert torch.allclose(optimizer.state[ps[j]]["exp_avg"].double(), m, atol=1e-6, rtol=0)


def test_state_dict_round_trips_and_a_resumed_run_is_bit_identical():
    whole = params()
    run(OneBitAdam(whole, freeze_step=3, **HYPER), whole, 8)
    first = params()
    optimizer = OneBitAdam(first, freeze_step=3, **HYPER)
    run(optimizer, first, 5)
    saved = copy.deepcopy(optimizer.state_dict())
    resumed = [p.detach().clone().requires_grad_() for p in first]
    again = OneBitAdam(resumed, freeze_step=3, **HYPER)
    again.load_state_dict(saved)
    run(again, resumed, 3, start=5)
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed))


@pytest.mark.parametrize("bad", [{"freeze_step": 0}, {"freeze_step": 2.5}, {"betas": (1.0, 0.9)},
                                 {"eps": 0.0}, {"lr": -1.0}, {"weight_decay": -0.1}])
def test_meaningless_arguments_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad)).replace("betas", "beta1")):
        OneBitAdam(params(), **{**HYPER, "freeze_step": 1, **bad})


def test_the_freeze_defaults_to_adams_averaging_horizon_one_over_one_minus_beta2():
    assert [variance_horizon(b) for b in (0.9, 0.95, 0.99, 0.999)] == [10, 20, 100, 1000]
    assert OneBitAdam(params(), lr=0.01, betas=(0.9, 0.99)).freeze_step == 100
    assert OneBitAdam(params(), lr=0.01).freeze_step == 1000  # torch's β2 0.999


def test_a_freeze_before_the_horizon_warns_once_it_is_given_and_not_at_or_after_it():
    with pytest.warns(EarlyFreezeWarning, match=r"after 20 steps, before its averaging horizon 1/\(1 − β2\) = 100"):
        OneBitAdam(params(), lr=0.01, betas=(0.9, 0.99), freeze_step=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        OneBitAdam(params(), lr=0.01, betas=(0.9, 0.99), freeze_step=100)
        OneBitAdam(params(), lr=0.01, betas=(0.9, 0.99))
