"""Rules a single value must meet, each a function from the value to what is wrong with it (None: fine)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], "str | None"]


def positive(value) -> str | None:
    return None if value > 0 and math.isfinite(value) else "must be a positive number"


def at_least(low: float, note: str = "") -> Check:
    return lambda value: None if value >= low else f"must be >= {number(low)}{_note(note)}"


def within(low: float, high: float, *, low_open: bool = False, high_open: bool = False, note: str = "") -> Check:
    """low ≤ value ≤ high, either end open; the message writes the interval as (a, b] and so on."""
    def check(value) -> str | None:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if above and below:
            return None
        interval = f"{'(' if low_open else '['}{number(low)}, {number(high)}{')' if high_open else ']'}"
        return f"must be in {interval}{_note(note)}"
    return check


def finite_non_negative(value) -> str | None:
    return None if value >= 0 and math.isfinite(value) else "must be a finite number >= 0"


def each_once(value: tuple) -> str | None:
    """A list, possibly empty: each value once."""
    return None if len(set(value)) == len(value) else "give each value once"


def distinct(value: tuple) -> str | None:
    """A list: at least one value, each once."""
    return "give at least one" if not value else each_once(value)


def problems(values: dict[str, Any], rules: dict[str, Check]) -> dict[str, str]:
    """name → what is wrong, for every value in `values` that breaks its rule."""
    found = {name: rule(values[name]) for name, rule in rules.items()}
    return {name: problem for name, problem in found.items() if problem}


def number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _note(note: str) -> str:
    return f" ({note})" if note else ""
