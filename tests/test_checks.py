"""The rules single values are checked against, and how they word what is wrong."""

import math

from scalesgd import checks


def test_each_rule_accepts_its_range_and_words_the_rest():
    assert checks.positive(1e-9) is None and checks.positive(0) == "must be a positive number"
    assert checks.positive(math.nan) and checks.positive(math.inf)
    assert checks.at_least(1, "steps")(0) == "must be >= 1 (steps)" and checks.at_least(1)(1) is None
    half_open = checks.within(0, 1, low_open=True)
    assert half_open(1) is None and half_open(0) == "must be in (0, 1]"
    assert checks.within(0, 1, high_open=True)(1) == "must be in [0, 1)"
    assert checks.finite_non_negative(0.0) is None and checks.finite_non_negative(-1.0)
    assert checks.distinct(()) == "give at least one" and checks.distinct((1, 1)) == "give each value once"
    assert checks.each_once(()) is None


def test_problems_collect_what_breaks_its_rule():
    rules = {"a": checks.positive, "b": checks.at_least(2)}
    assert checks.problems({"a": 1, "b": 1}, rules) == {"b": "must be >= 2"}
