"""The noise-scale estimates against a brute-force tr(Σ) and |G|² from per-sample gradients of a tiny model."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.recipe.noise_scale import NoiseScale, estimates


def per_sample_gradients(samples=4096, features=6, seed=0):
    """Per-sample gradients of a tiny logistic-regression model at fixed weights, in closed form."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g, dtype=torch.float64)
    y = (x[:, 0] + 0.5 * torch.randn(samples, generator=g, dtype=torch.float64) > 0).double()
    w = 0.3 * torch.randn(features, generator=g, dtype=torch.float64)
    return (torch.sigmoid(x @ w) - y)[:, None] * x  # ∂ BCE / ∂w per sample


def test_estimates_average_to_the_brute_force_trace_and_gradient_norm():
    grads = per_sample_gradients()
    true_g = grads.mean(0)
    true_gradient_sq = float(true_g.square().sum())
    true_trace = float(((grads - true_g).square().sum(1)).mean())  # tr Σ of one sample's gradient
    workers, b = 4, 16
    g = torch.Generator().manual_seed(1)
    found, ns = [], NoiseScale()
    for _ in range(3000):  # each "step": 4 workers × 16 samples drawn from the population
        local = grads[torch.randint(0, len(grads), (workers, b), generator=g)].mean(1)
        small_sq = float(local.square().sum(1).mean())
        big_sq = float(local.mean(0).square().sum())
        found.append(estimates(small_sq, big_sq, b, workers * b))
        ns.update(small_sq, big_sq, b, workers * b)
    gradient_sq, trace = torch.tensor(found).mean(0).tolist()
    assert gradient_sq == pytest.approx(true_gradient_sq, rel=0.05)
    assert trace == pytest.approx(true_trace, rel=0.05)
    assert trace / gradient_sq == pytest.approx(true_trace / true_gradient_sq, rel=0.1)
    assert ns.average == pytest.approx(trace / gradient_sq, rel=1e-5)  # the run's average: the ratio of the sums


def test_the_run_average_weighs_steps_by_their_gradient_and_keeps_negative_estimates():
    ns = NoiseScale()
    # |G|² = 4, tr Σ = 40 (B = 10), then |G|² = 1, tr Σ = 90 (B = 90), then a step whose |G|² reads −1
    for small_sq, big_sq in ((8.0, 6.0), (10.0, 5.5), (10.0, 4.5)):
        ns.update(small_sq, big_sq, small=10, big=20)
    assert ns.average == pytest.approx((40 + 90 + 110) / (4 + 1 - 1))  # not the mean or median of 10, 90 and −110
    never = NoiseScale()
    never.update(1.0, 0.9, small=10, big=20)  # |G|² = 0.8
    never.update(1.0, 0.0, small=10, big=20)  # |G|² = −1
    assert never.average is None  # the summed |G|² is −0.2: noise swamps the signal over the whole run


@settings(max_examples=50, deadline=None)
@given(st.floats(0.01, 10), st.floats(0.0, 100), st.integers(1, 64), st.integers(2, 64))
def test_noise_free_gradients_have_zero_trace_and_their_own_norm(norm_sq, _, small, workers):
    gradient_sq, trace = estimates(norm_sq, norm_sq, small, small * workers)  # every batch sees the same gradient
    assert gradient_sq == pytest.approx(norm_sq) and trace == pytest.approx(0.0, abs=1e-9 * norm_sq * small)


def test_the_smoothed_ratio_and_its_state_round_trip():
    ns = NoiseScale()
    assert ns.value is None
    for _ in range(200):
        ns.update(small_sq=3.0, big_sq=1.5, small=10, big=40)  # |G|² = 1, tr Σ = 20: B_simple = 20
    assert ns.value == pytest.approx(20.0, rel=1e-6)
    assert ns.average == pytest.approx(20.0)
    again = NoiseScale.from_state(ns.state())
    assert again == ns
    older = NoiseScale.from_state(ns.state()[:3])  # a checkpoint from before the run's sums were kept
    assert older.value == ns.value and older.average is None
    with pytest.raises(ValueError, match="larger batch than each worker's"):
        estimates(1.0, 1.0, 32, 32)
