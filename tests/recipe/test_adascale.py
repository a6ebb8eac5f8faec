"""AdaScale's gain and its scale-invariant schedule."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalesgd.recipe.adascale import AdaScaleFactor, gain
from scalesgd.recipe.schedule import LrFactor


@given(st.floats(-10, 1e4), st.floats(-1, 1e3), st.integers(1, 256), st.integers(2, 64))
def test_the_gain_lies_between_one_and_the_batch_ratio(trace, gradient_sq, base, ratio):
    assert 1.0 <= gain(trace, gradient_sq, base, base * ratio) <= ratio


def test_the_gain_follows_the_noise():
    assert gain(0.0, 0.0, 32, 256) == 1.0  # nothing measured yet: the base rate
    assert gain(1e6, 1e-6, 32, 256) == pytest.approx(8.0, rel=1e-3)  # noise dominates: worth the whole ratio
    assert gain(1e-6, 1.0, 32, 256) == pytest.approx(1.0, rel=1e-3)  # the gradient dominates: one base step
    trace, gradient_sq = 64.0, 1.0  # σ² = 2 at the base batch: r = (2 + 1) / (2/8 + 1)
    assert gain(trace, gradient_sq, 32, 256) == pytest.approx(3.0 / 1.25)


def test_the_schedule_runs_in_scale_invariant_steps():
    base = LrFactor(total_steps=800, steps_per_epoch=80, warmup="none", schedule="cosine")
    factor = AdaScaleFactor.over(base, 8.0)
    assert factor(0) == pytest.approx(1 / 8)  # the peak is base rate × 8: at gain 1, the base rate
    factor.gain = 4.0
    for _ in range(50):
        factor.advance()
    assert factor.progress == 200.0
    assert factor(123) == pytest.approx(4 / 8 * base(200))  # the step count LambdaLR passes is not used


def test_the_run_ends_when_the_base_schedule_is_done():
    base = LrFactor(total_steps=800, steps_per_epoch=80, warmup="none", schedule="cosine")
    factor = AdaScaleFactor.over(base, 8.0)  # 10 steps an epoch at 8× the base batch of 80
    assert factor.epochs_at_most(10) == 80  # at gain 1, one base step a step: 8× the base batch's epochs
    factor.gain = 3.0
    steps = 0
    while not factor.done:
        factor.advance()
        steps += 1
    assert steps == 267 and factor.progress == 801.0  # the first step at or past 800 ends it
    factor.progress = 799.5
    assert not factor.done
