"""The delay line the testbed's forwarder holds frames in: each frame out after its delay, in the order it came."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalesgd.testbed.delay import DelayLine


@given(st.floats(0, 0.2), st.lists(st.floats(0, 1), max_size=30), st.lists(st.floats(0, 2), max_size=30))
def test_every_frame_leaves_after_its_delay_in_the_order_it_came(delay, arrivals, polls):
    line, arrivals = DelayLine(delay), sorted(arrivals)
    out = []
    for i, at in enumerate(arrivals):
        out += [(frame, at) for frame in line.due(at)]
        line.hold(str(i).encode(), at)
    for at in sorted(p + (arrivals[-1] if arrivals else 0) for p in polls) + [10.0]:
        out += [(frame, at) for frame in line.due(at)]
    assert [frame for frame, _ in out] == [str(i).encode() for i in range(len(arrivals))] and not len(line)
    assert all(left >= arrivals[int(frame)] + delay for frame, left in out)


def test_the_wait_is_until_the_oldest_frame_is_due():
    line = DelayLine(0.05)
    assert line.wait_s(0.0) is None
    line.hold(b"a", 1.0)
    line.hold(b"b", 1.01)
    assert line.wait_s(1.02) == pytest.approx(0.03) and line.due(1.049) == [] and line.due(1.05) == [b"a"]
    assert line.wait_s(2.0) == 0.0


def test_a_negative_delay_is_refused_naming_it():
    with pytest.raises(ValueError, match="delay_s -1"):
        DelayLine(-1)
