"""Warmup and decay as one pure function of the global step, driven by a single LambdaLR."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from scalesgd.registry import Registry

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
        return 1.0 if step >= self.warmup_steps else WARMUPS[self.warmup](self, step)

    def decay_factor(self, step: int) -> float:
        return SCHEDULES[self.schedule](self, step)

    def progress(self, step: int) -> float:
        """How far past warmup `step` is, from 0 at its end to 1 at the last step."""
        return min(max(step - self.warmup_steps, 0) / max(self.total_steps - self.warmup_steps, 1), 1.0)


# warmup → its factor at a step before the end of warmup
WARMUPS: Registry[Callable[[LrFactor, int], float]] = Registry("warmup")
WARMUPS.add("gradual", lambda f, step: f.start + (1.0 - f.start) * step / f.warmup_steps)
WARMUPS.add("constant", lambda f, step: f.start)
WARMUPS.add("none", lambda f, step: 1.0)

# schedule → its decay factor at a step (step and arccot over the whole run, cosine and poly after warmup)
SCHEDULES: Registry[Callable[[LrFactor, int], float]] = Registry("schedule")
SCHEDULES.add("step", lambda f, step: f.gamma ** sum(1 for m in f.milestones if step / f.steps_per_epoch >= m))
SCHEDULES.add("cosine", lambda f, step: f.end + (1.0 - f.end) * 0.5 * (1.0 + math.cos(math.pi * f.progress(step))))
SCHEDULES.add("poly", lambda f, step: f.end + (1.0 - f.end) * (1.0 - f.progress(step)) ** f.power)
SCHEDULES.add("arccot", lambda f, step: 0.5 - math.atan(f.arccot_slope * (step / f.steps_per_epoch
                                                                           - f.arccot_epoch)) / math.pi)


def default_milestones(epochs: int) -> tuple[float, ...]:
    """Goyal et al.'s ×0.1 at epochs 30, 60 and 80 of 90, scaled to `epochs`."""
    return tuple(round(f * epochs, 6) for f in GOYAL_MILESTONE_FRACTIONS)


def build_scheduler(optimizer: torch.optim.Optimizer, factor: LrFactor) -> torch.optim.lr_scheduler.LambdaLR:
    """The one scheduler of a run: LambdaLR over `factor`, stepped once per iteration."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factor)
