import math
import pickle

import pytest
import torch

from scalesgd.recipe import LrFactor, build_scheduler, default_milestones


def factor(**kw):
    base = dict(total_steps=100, steps_per_epoch=10, warmup="gradual", warmup_steps=20, start=0.125,
                schedule="step", milestones=(5.0, 8.0))
    base.update(kw)
    return LrFactor(**base)


def test_gradual_warmup_rises_by_a_constant_amount_each_iteration_to_the_scaled_rate():
    f = factor()
    values = [f(s) for s in range(21)]
    assert values[0] == pytest.approx(0.125)
    steps = [b - a for a, b in zip(values, values[1:])]
    assert all(d == pytest.approx((1 - 0.125) / 20) for d in steps)
    assert values[20] == pytest.approx(1.0)


def test_constant_warmup_holds_base_then_jumps():
    f = factor(warmup="constant")
    assert [f(s) for s in (0, 10, 19)] == [0.125] * 3
    assert f(20) == 1.0


def test_no_warmup_starts_at_the_scaled_rate():
    assert factor(warmup="none")(0) == 1.0


def test_step_schedule_multiplies_by_gamma_at_each_milestone_epoch():
    f = factor(warmup="none")
    assert f(49) == 1.0
    assert f(50) == pytest.approx(0.1)
    assert f(79) == pytest.approx(0.1)
    assert f(80) == pytest.approx(0.01)


def test_cosine_and_poly_decay_from_end_of_warmup_to_zero():
    for schedule in ("cosine", "poly"):
        f = factor(schedule=schedule)
        assert f(20) == pytest.approx(1.0)
        assert f(100) == pytest.approx(0.0, abs=1e-12)
        values = [f(s) for s in range(20, 101)]
        assert all(b <= a + 1e-12 for a, b in zip(values, values[1:]))
    assert factor(schedule="cosine")(60) == pytest.approx(0.5)
    assert factor(schedule="poly", power=2.0)(60) == pytest.approx(0.25)


def test_cosine_and_poly_end_at_the_end_rate():
    for schedule in ("cosine", "poly"):
        f = factor(schedule=schedule, end=0.05)
        assert f(20) == pytest.approx(1.0)
        assert f(100) == pytest.approx(0.05)
        assert min(f(s) for s in range(20, 101)) == pytest.approx(0.05)
    assert factor(schedule="poly", power=1.0, end=0.2)(60) == pytest.approx(0.2 + 0.8 * 0.5)


def test_arccot_is_half_at_epoch_e_near_one_long_before_and_near_zero_long_after():
    f = factor(warmup="none", schedule="arccot", arccot_epoch=5.0, arccot_slope=2.0, total_steps=10_000)
    assert f(50) == pytest.approx(0.5)  # epoch 5
    assert f(0) == pytest.approx(0.5 + math.atan(10) / math.pi)  # arccot(−10)/π
    assert f(0) > 0.96 and f(9_999) < 0.001
    values = [f(s) for s in range(0, 1000)]
    assert all(b < a for a, b in zip(values, values[1:]))
    # symmetric about e: f(e − x) + f(e + x) = 1
    assert all(f(50 - d) + f(50 + d) == pytest.approx(1.0) for d in range(0, 50, 7))


def test_arccot_composes_with_gradual_warmup():
    f = factor(schedule="arccot", arccot_epoch=6.0, arccot_slope=1.0)
    g = factor(warmup="none", schedule="arccot", arccot_epoch=6.0, arccot_slope=1.0)
    assert f(0) == pytest.approx(0.125 * g(0))
    assert f(10) == pytest.approx((0.125 + 0.875 * 10 / 20) * g(10))
    assert f(40) == g(40)


def test_default_milestones_follow_goyal_30_60_80_of_90():
    assert default_milestones(90) == pytest.approx((30, 60, 80))
    assert default_milestones(9) == pytest.approx((3, 6, 8))


def test_factor_is_picklable_and_equal_after_round_trip():
    f = factor()
    g = pickle.loads(pickle.dumps(f))
    assert g == f and [g(s) for s in range(100)] == [f(s) for s in range(100)]


def _rates(opt, sched, steps):
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


SCHEDULE_CASES = [dict(schedule="step"), dict(schedule="cosine", end=0.01), dict(schedule="poly", power=1.5, end=0.1),
                  dict(schedule="arccot", arccot_epoch=6.0, arccot_slope=0.8),
                  dict(schedule="arccot", warmup="constant", arccot_epoch=3.0),
                  dict(schedule="cosine", warmup="none")]


@pytest.mark.parametrize("kw", SCHEDULE_CASES, ids=lambda kw: "-".join(map(str, kw.values())))
def test_lambdalr_applies_factor_to_scaled_rate_and_resumes_exactly(kw):
    w = torch.nn.Parameter(torch.zeros(1))
    f = factor(**kw)
    opt = torch.optim.SGD([w], lr=0.8)
    sched = build_scheduler(opt, f)
    full = _rates(opt, sched, 100)
    assert full == pytest.approx([0.8 * f(s) for s in range(100)])

    opt2 = torch.optim.SGD([w], lr=0.8)
    sched2 = build_scheduler(opt2, f)
    first = _rates(opt2, sched2, 37)
    state = (opt2.state_dict(), sched2.state_dict())
    opt3 = torch.optim.SGD([w], lr=0.8)
    sched3 = build_scheduler(opt3, factor(**kw))
    opt3.load_state_dict(state[0])
    sched3.load_state_dict(state[1])
    assert first + _rates(opt3, sched3, 63) == full
