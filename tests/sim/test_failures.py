"""What failures cost a run in `scalesgd simulate --mtbf-hours`."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalesgd.sim.failures import ELASTIC_FAULT_S, Failures

FAILURES = Failures(mtbf_s=3600.0, restart_s=10.0, checkpoint_s=600.0)


def test_a_stop_the_world_failure_costs_the_restart_and_half_a_checkpoint_interval_whatever_the_workers():
    assert FAILURES.per_failure_s(2, None) == FAILURES.per_failure_s(64, None) == 10.0 + 300.0


def test_an_elastic_failure_costs_the_drop_and_one_workers_half_round_and_restart():
    assert FAILURES.per_failure_s(4, 2.0) == pytest.approx(ELASTIC_FAULT_S + (1.0 + 10.0) / 4)


@given(workers=st.integers(1, 1024), seconds=st.floats(1, 1e6), cost=st.floats(0.01, 1e4))
def test_failures_stretch_a_run_by_the_share_of_time_they_take_or_it_never_ends(workers, seconds, cost):
    lost = workers * cost / FAILURES.mtbf_s
    stretched = FAILURES.stretched(seconds, workers, cost)
    if lost >= 1:
        assert stretched is None
    else:
        assert stretched == pytest.approx(seconds / (1 - lost)) and stretched >= seconds
    assert FAILURES.stretched(None, workers, cost) is None  # a mode that missed the target still misses it
