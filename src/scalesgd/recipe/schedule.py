"""Warmup and decay as one pure function of the global step, driven by a single LambdaLR."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

WARMUPS = ("gradual", "constant", "none")
SCHEDULES = ("step", "cosine", "poly", "arccot")
GOYAL_MILESTONE_FRACTIONS = (30 / 90, 60 / 90, 80 / 90)


@dataclass(frozen=True)
class LrFactor:
    """Multiplier of the scaled rate at a global step; picklable, so a checkpoint restores it.

    The optimizer's rate is the scaled (target) rate kη. During warmup the factor starts at
    `start` = η / kη: gradual warmup adds a constant amount every iteration until it reaches 1
    after `warmup_steps`; constant warmup holds `start` and then jumps to 1. The decay schedule
    multiplies it: step and arccot are functions of the epoch over the whole training, cosine and
    poly run from the end of warmup to `end` (the final rate as a fraction of the scaled rate).
    arccot is Fujitsu's arccot(a·(t − e))/π with t in epochs: ≈ 1 well before epoch e, ½ at e, → 0 after.
    """

    total_steps: int
    steps_per_epoch: int
    warmup: str = "gradual"
    warmup_steps: int = 0
    start: float = 1.0
    schedule: str = "step"
    milestones: tuple[float, ...] = ()
    gamma: float = 0.1
    power: float = 2.0
    end: float = 0.0
    arccot_epoch: float = 0.0
    arccot_slope: float = 1.0

    def __call__(self, step: int) -> float:
        return self.warmup_factor(step) * self.decay_factor(step)

    def warmup_factor(self, step: int) -> float:
        if self.warmup == "none" or step >= self.warmup_steps:
            return 1.0
        if self.warmup == "constant":
            return self.start
        return self.start + (1.0 - self.start) * step / self.warmup_steps

    def decay_factor(self, step: int) -> float:
        epoch = step / self.steps_per_epoch
        if self.schedule == "step":
            return self.gamma ** sum(1 for m in self.milestones if epoch >= m)
        if self.schedule == "arccot":
            return 0.5 - math.atan(self.arccot_slope * (epoch - self.arccot_epoch)) / math.pi
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min(max(step - self.warmup_steps, 0) / span, 1.0)
        if self.schedule == "cosine":
            return self.end + (1.0 - self.end) * 0.5 * (1.0 + math.cos(math.pi * progress))
        if self.schedule == "poly":
            return self.end + (1.0 - self.end) * (1.0 - progress) ** self.power
        raise ValueError(f"unknown schedule {self.schedule!r}; choose from {', '.join(SCHEDULES)}")


def default_milestones(epochs: int) -> tuple[float, ...]:
    """Goyal et al.'s ×0.1 at epochs 30, 60 and 80 of 90, scaled to `epochs`."""
    return tuple(round(f * epochs, 6) for f in GOYAL_MILESTONE_FRACTIONS)


def build_scheduler(optimizer: torch.optim.Optimizer, factor: LrFactor) -> torch.optim.lr_scheduler.LambdaLR:
    """The one scheduler of a run: LambdaLR over `factor`, stepped once per iteration."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factor)
