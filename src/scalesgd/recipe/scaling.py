"""Learning-rate scaling rules for a larger minibatch (Goyal et al. 2017, Accurate, Large Minibatch SGD)."""

from __future__ import annotations

import math
from collections.abc import Callable

from scalesgd.registry import Registry

# rule → the factor on the base rate for a minibatch `ratio` times the base batch
SCALING_RULES: Registry[Callable[[float], float]] = Registry("scaling rule")
SCALING_RULES.add("linear", lambda ratio: ratio)
SCALING_RULES.add("sqrt", math.sqrt)
SCALING_RULES.add("none", lambda ratio: 1.0)
SCALING_RULES.add("adascale", lambda ratio: ratio)  # the most AdaScale's measured gain reaches (recipe.adascale)


def scaled_lr(base_lr: float, batch: int, base_batch: int, rule: str) -> float:
    """Return the rate for global minibatch `batch`, given `base_lr` tuned at `base_batch`."""
    return base_lr * SCALING_RULES[rule](batch / base_batch)
