"""The one timing model: when each group's exchange runs, how much of it backward hides."""

import pytest

from scalesgd.comm.cost.timing import timeline


def test_timeline_by_hand():
    # forward 1; backward of layers 2, 1, 0 takes 1 each; every message takes 2
    line = timeline([[2], [1], [0]], 1.0, [1.0, 1.0, 1.0], [1, 1, 1], lambda d: 2.0, lambda d: 0.0)
    # messages: [2, 4], [4, 6], [6, 8]; backward ends at 4
    assert (line.end, line.backward_end, line.busy, line.overlapped) == (8.0, 4.0, 6.0, 2.0)
    assert line.exposed == 4.0


def test_inline_work_delays_backward_and_nothing_overlaps_one_group_after_backward():
    line = timeline([[1, 0]], 0.5, [1.0, 1.0], [1, 1], lambda d: 3.0, lambda d: 0.25 * d)
    assert line.backward_end == pytest.approx(2.5 + 0.5)  # selection of both layers' 2 elements on the path
    assert line.overlapped == 0.0 and line.end == pytest.approx(6.0)


def test_a_free_exchange_ends_with_backward():
    line = timeline([[2, 1], [0]], 1.0, [1.0, 2.0, 3.0], [5, 5, 5], lambda d: 0.0, lambda d: 0.0)
    assert line.end == line.backward_end == 7.0 and line.exposed == 0.0
