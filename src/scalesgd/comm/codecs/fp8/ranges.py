"""fp8's settings and each tensor's range: what maps to the top of e5m2, when it is measured, when it gives up."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalesgd import checks
from scalesgd.options import option


@dataclass(frozen=True)
class Fp8Options:
    """The fp8 codecs' options (fp8, fp8-direct, fp8-flat): ε of the relative data, the quantile Q, its period N
    and sample count R, the headroom above the quantile, and when a saturating tensor goes dense.

    Q = 1 (the sampled maximum) with headroom 128 measured best on real gradients (`scalesgd bench fp8-range`,
    docs/results.md); Oyama et al. 2020's setting is Q = 0.95 with headroom 1.
    """

    eps: float = option(1e-5, "ε of fp8's relative data g/(|w|+ε)", check=checks.positive)
    quantile: float = option(1.0, "fp8 range: this quantile of |data| (1: the sampled maximum), times the headroom, "
                             "maps to the top of e5m2 (Oyama et al.'s: 0.95)",
                             check=checks.within(0, 1, low_open=True))
    period: int = option(100, "fp8 range re-estimated every N steps", check=checks.at_least(1, "steps"))
    samples: int = option(1024, "elements sampled per tensor for it", check=checks.at_least(1))
    headroom: float = option(128.0, "fp8 range: headroom × the quantile maps to the top (Oyama et al.'s: 1)",
                             check=checks.at_least(1, "1 maps the quantile to the top"))
    saturation_limit: float = option(0.01, "fp8: a tensor saturating more than this fraction of its elements on "
                                     "some rank …", check=checks.within(0, 1, high_open=True,
                                                                        note="0 never goes dense"))
    saturation_window: int = option(50, "… for this many steps in a row is sent dense (limit 0: never)",
                                    check=checks.at_least(1, "steps"))


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
