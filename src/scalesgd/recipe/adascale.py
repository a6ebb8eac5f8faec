"""AdaScale SGD (Johnson et al., ICML 2020): the rate follows the measured gain of the larger batch instead of the
batch ratio, so no warmup needs tuning.

With S = B ÷ base batch, the gain r = (σ² + |G|²) ÷ (σ²/S + |G|²) ∈ [1, S], σ² = tr(Σ) ÷ base batch being the
variance of a base-batch gradient: r ≈ S while noise dominates (the large batch is worth S small steps), r → 1
once the gradient does. Each step trains at base rate × r and the schedule advances r "scale-invariant
iterations": the base batch's schedule, with its epochs in base-batch steps. As in the paper's algorithm, the run
ends when that schedule is done (τ reaches its total), not after a fixed number of epochs: with r < S it takes
more epochs than the base batch's, at most S times as many. r comes from the smoothed noise estimates of
`scalesgd.recipe.noise_scale`, which the loop reads every --sync-every steps (no per-step host sync).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from scalesgd.recipe.schedule import LrFactor


def gain(trace: float, gradient_sq: float, base_batch: float, batch: float) -> float:
    """r for a batch of `batch` over `base_batch`, from tr(Σ) and |G|²; 1 before any estimate, within [1, S]."""
    scale = batch / base_batch
    if trace == 0 and gradient_sq == 0:
        return 1.0
    if gradient_sq <= 0:
        return scale  # noise swamps the signal: the larger batch is worth its whole ratio
    r = (trace / base_batch + gradient_sq) / (trace / batch + gradient_sq)
    return min(max(r, 1.0), scale)


@dataclass
class AdaScaleFactor:
    """The LambdaLR factor on the peak rate (base rate × S): r ÷ S times the base schedule at τ, the scale-invariant
    iterations so far. Its fields are plain numbers, so a checkpoint keeps them (and loads with weights_only)."""

    schedule: dict  # the base batch's LrFactor, as fields: steps are base-batch steps
    scale: float
    gain: float = 1.0
    progress: float = 0.0  # τ, in base-batch steps

    @classmethod
    def over(cls, base: LrFactor, scale: float) -> AdaScaleFactor:
        return cls(asdict(base), scale)

    @property
    def base(self) -> LrFactor:
        return LrFactor(**self.schedule)

    def __call__(self, step: int) -> float:
        return self.gain / self.scale * self.base(self.progress)

    @property
    def done(self) -> bool:
        """Whether τ has covered the base batch's whole schedule: where the run ends (asked every step, so read
        from the stored fields rather than through `base`)."""
        return self.progress >= self.schedule["total_steps"]

    def epochs_at_most(self, steps_per_epoch: int) -> int:
        """The most epochs of `steps_per_epoch` steps the run can take: r ≥ 1, so τ gains at least one a step."""
        return math.ceil(self.schedule["total_steps"] / steps_per_epoch)

    def advance(self) -> None:
        """One step taken at the current gain: τ moves on by r."""
        self.progress += self.gain

    def resume_from(self, other: AdaScaleFactor) -> None:
        """Where a checkpointed run stood: its gain and τ."""
        self.gain, self.progress = float(other.gain), float(other.progress)
