"""The gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al., 2018, "An Empirical Model of Large-Batch
Training", Appendix A.1): the batch beyond which a larger batch stops paying, measured from what data-parallel
training already has, each worker's gradient over its b samples and their mean over all B = W·b.

E|g_b|² = |G|² + tr(Σ)/b for a batch of b, so the two squared norms give unbiased estimates of both terms:
|G|² ≈ (B·|g_B|² − b·|g_b|²)/(B − b) and tr(Σ) ≈ (|g_b|² − |g_B|²)/(1/b − 1/B). Single steps are noisy; each
term is smoothed on its own (an exponential moving average, bias-corrected as Adam's) and the ratio taken last.

B_simple grows as training converges (|G|² shrinks), so one run has no single value. Besides the smoothed ratio of
the moment, the run's sums of both estimates give its training average, tr(Σ) and |G|² each averaged over every
step before the ratio is taken (McCandlish et al. average the two separately): steps with a large |G|² weigh most,
and steps whose |G|² estimate comes out negative (noise swamps the signal) still count instead of being dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.95  # the moving averages' weight on the past: about the last 20 steps count


def estimates(small_sq: float, big_sq: float, small: float, big: float) -> tuple[float, float]:
    """(|G|², tr(Σ)) from the mean squared norm of gradients over batches of `small` samples and the squared norm
    of their mean over `big` samples."""
    if not big > small > 0:
        raise ValueError(f"the noise scale needs a larger batch than each worker's: got {small} and {big}")
    gradient_sq = (big * big_sq - small * small_sq) / (big - small)
    trace = (small_sq - big_sq) / (1.0 / small - 1.0 / big)
    return gradient_sq, trace


@dataclass
class NoiseScale:
    """The smoothed estimates and the steps seen; `update` once per step, `value` is B_simple in samples."""

    decay: float = DECAY
    gradient_sq: float = 0.0
    trace: float = 0.0
    steps: int = 0
    gradient_sq_sum: float = 0.0  # the run's sums of the unsmoothed estimates, for `average`
    trace_sum: float = 0.0

    def update(self, small_sq: float, big_sq: float, small: float, big: float) -> None:
        gradient_sq, trace = estimates(small_sq, big_sq, small, big)
        self.gradient_sq = self.decay * self.gradient_sq + (1 - self.decay) * gradient_sq
        self.trace = self.decay * self.trace + (1 - self.decay) * trace
        self.gradient_sq_sum += gradient_sq
        self.trace_sum += trace
        self.steps += 1

    @property
    def value(self) -> float | None:
        """B_simple; None before any step, or while the smoothed |G|² is not positive (noise swamps the signal)."""
        if not self.steps or self.gradient_sq <= 0:
            return None
        return self.trace / self.gradient_sq  # the bias corrections of both averages cancel in the ratio

    @property
    def average(self) -> float | None:
        """B_simple averaged over the run so far: the ratio of the summed estimates; None as for `value`."""
        if not self.steps or self.gradient_sq_sum <= 0:
            return None
        return self.trace_sum / self.gradient_sq_sum

    def state(self) -> list[float]:
        return [self.gradient_sq, self.trace, float(self.steps), self.gradient_sq_sum, self.trace_sum]

    @classmethod
    def from_state(cls, state) -> NoiseScale:
        """From `state()`'s list; a checkpoint written before the sums were kept starts them afresh."""
        if not state:
            return cls()
        sums = [float(x) for x in state[3:5]] if len(state) >= 5 else [0.0, 0.0]
        return cls(DECAY, float(state[0]), float(state[1]), int(state[2]), *sums)
