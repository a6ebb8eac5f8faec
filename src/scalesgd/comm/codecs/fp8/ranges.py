"""fp8's settings and each tensor's range: what maps to the top of e5m2, when it is measured, when it gives up."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalesgd import checks


@dataclass(frozen=True)
class Fp8Options:
    """ε of the relative data, the quantile Q, its period N and sample count R, the headroom above the
    quantile, and when a saturating tensor goes dense.

    Q = 1 (the sampled maximum) with headroom 128 measured best on real gradients (`scalesgd bench fp8-range`,
    docs/BENCHMARKS.md); the seed's setting is Q = 0.95 with headroom 1.
    """

    eps: float = 1e-5
    quantile: float = 1.0
    period: int = 100
    samples: int = 1024
    headroom: float = 128.0  # headroom·q maps to the top of e5m2
    saturation_limit: float = 0.01  # a tensor saturating more than this fraction of its elements …
    saturation_window: int = 50  # … on some rank for this many steps in a row is sent dense (0 limit: never)

    def problems(self) -> dict[str, str]:
        """Setting → what is wrong with it (empty when valid)."""
        return checks.problems(vars(self), {"eps": checks.positive,
                                            "quantile": checks.within(0, 1, low_open=True),
                                            "period": checks.at_least(1, "steps"),
                                            "samples": checks.at_least(1),
                                            "headroom": checks.at_least(1, "1 maps the quantile to the top"),
                                            "saturation_limit": checks.within(0, 1, high_open=True,
                                                                              note="0 never goes dense"),
                                            "saturation_window": checks.at_least(1, "steps")})


class TensorRange:
    """One parameter tensor's range q (max over ranks), whether it was measured, its steps and saturation."""

    def __init__(self):
        self.q: float | None = None
        self.measured = False  # False: q stands in (max |D|, or the last range); measure again next step
        self.step = 0
        self.hot = 0  # steps in a row some rank saturated it beyond the limit
        self.dense = False  # its bucket is exchanged dense for good

    def due(self, period: int) -> bool:
        return not self.measured or self.step % period == 0

    def update(self, quantile: float, largest: float) -> None:
        """Take a measurement (both max-reduced over ranks): the quantile when it is a positive finite
        range; else the exact max |D| or, for a tensor of zeros or non-finite values, the last range;
        either way measured again next step."""
        self.measured = 0 < quantile < math.inf
        if self.measured:
            self.q = quantile
        elif 0 < largest < math.inf:
            self.q = largest
        elif self.q is None:
            self.q = 1.0  # all zeros (any range is exact) or not finite (the bucket's flag says so)

    def state_dict(self) -> dict:
        return {"q": self.q, "measured": self.measured, "step": self.step, "hot": self.hot, "dense": self.dense}

    @classmethod
    def from_state(cls, saved: dict) -> TensorRange:
        r = cls()
        r.q, r.measured, r.step = saved["q"], bool(saved["measured"]), int(saved["step"])
        r.hot, r.dense = int(saved["hot"]), bool(saved["dense"])
        return r


def sample_quantiles(g: torch.Tensor, w: torch.Tensor | None, offsets: list[int], sizes: list[int],
                     options: Fp8Options, generator: torch.Generator) -> torch.Tensor:
    """Per tensor, the Q-quantile of |D| (D = g/(|w|+ε), or g without `w`) over R random elements.

    Tensors of at most R elements use all of them, so the estimate is exact there.
    """
    q = torch.empty(len(sizes))
    for i, (start, n) in enumerate(zip(offsets, sizes)):
        if n <= options.samples:
            idx = torch.arange(start, start + n, device=g.device)
        else:
            idx = torch.randint(n, (options.samples,), generator=generator).to(g.device) + start
        d = g[idx].float().abs()
        if w is not None:
            d = d / (w[idx].abs() + options.eps)
        q[i] = torch.quantile(d, options.quantile).cpu() if n else 0.0
    return q
