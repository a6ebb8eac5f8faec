import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalesgd.recipe import scaled_lr


def test_linear_rule_multiplies_rate_by_batch_ratio():
    assert scaled_lr(0.1, 8192, 256, "linear") == pytest.approx(3.2)


def test_sqrt_rule():
    assert scaled_lr(0.1, 8192, 256, "sqrt") == pytest.approx(0.1 * math.sqrt(32))


def test_none_rule_keeps_base_rate():
    assert scaled_lr(0.1, 8192, 256, "none") == 0.1


@given(st.floats(1e-4, 10), st.integers(1, 100_000), st.integers(1, 4096))
def test_rules_agree_at_base_batch_and_order_above_it(base_lr, batch, base_batch):
    lin, sq, none = (scaled_lr(base_lr, batch, base_batch, r) for r in ("linear", "sqrt", "none"))
    assert scaled_lr(base_lr, base_batch, base_batch, "linear") == pytest.approx(base_lr)
    if batch >= base_batch:
        assert lin >= sq * (1 - 1e-12) and sq >= none * (1 - 1e-12)
    else:
        assert lin <= sq * (1 + 1e-12) and sq <= none * (1 + 1e-12)


def test_unknown_rule_names_choices():
    with pytest.raises(ValueError, match="linear, sqrt, none"):
        scaled_lr(0.1, 512, 256, "cubic")
