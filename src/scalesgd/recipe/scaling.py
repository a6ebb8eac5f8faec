"""Learning-rate scaling rules for a larger minibatch (Goyal et al., SPEC §1)."""

import math

SCALING_RULES = ("linear", "sqrt", "none")


def scaled_lr(base_lr: float, batch: int, base_batch: int, rule: str) -> float:
    """Return the rate for global minibatch `batch`, given `base_lr` tuned at `base_batch`."""
    ratio = batch / base_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    if rule == "none":
        return base_lr
    raise ValueError(f"unknown scaling rule {rule!r}; choose from {', '.join(SCALING_RULES)}")
