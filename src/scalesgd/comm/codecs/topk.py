"""Top-k sparsification with residuals (SPEC §3): DLGS's reused thresholds, or an exact top-k each step.

Per bucket (a layer, or a group of layers merged by the planner) and per rank:
g = residual + gradient; the entries with |g| ≥ H are sent, the rest stay as the next residual.
H is the exact threshold — the k-th largest |g|, k = ⌈ρ·n⌉ — recomputed every `reuse` steps and
reused in between (DLGS); `reuse=1` is an exact top-k every step (LAGS per layer, global Top-K on
one bucket holding everything).
"""

from __future__ import annotations

import math

import torch

from scalesgd import checks
from scalesgd.comm.codecs.base import BucketView, Channel, Codec
from scalesgd.comm.sparse import allgather_sparse, mean_of_sparse


class _Sparse:
    """One bucket's residual, threshold and step count."""

    def __init__(self, numel: int, device: torch.device):
        self.residual = torch.zeros(numel, device=device)
        self.threshold = 0.0
        self.step = 0


def problems(density: float, reuse: int) -> dict[str, str]:
    """Setting → what is wrong with it: the fraction sent, and how many steps a threshold serves."""
    return checks.problems({"density": density, "reuse": reuse},
                           {"density": checks.within(0, 1, low_open=True),
                            "reuse": checks.at_least(1, "1 recomputes the threshold every step")})


class TopkCodec(Codec):
    """Send ⌈density·n⌉ (about, between recomputations) entries per bucket as (index, value) pairs.

    Selection runs in backward as soon as a bucket is full, as DLGS's timing model has it.
    """

    encode_in_backward = True

    def __init__(self, name: str = "topk", density: float = 0.1, reuse: int = 1):
        found = problems(density, reuse)
        if found:
            given = {"density": density, "reuse": reuse}
            raise ValueError("; ".join(f"{setting} {given[setting]}: {problem}" for setting, problem in found.items()))
        self.name, self.density, self.reuse = name, density, reuse
        self._state: dict[int, _Sparse] = {}
        self._sent: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def k(self, numel: int) -> int:
        return max(1, math.ceil(self.density * numel))

    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        """Accumulate, select, keep the rest; what travels is held until `communicate`."""
        st = self._state.get(bucket.index)
        if st is None or st.residual.numel() != flat.numel():
            st = self._state[bucket.index] = _Sparse(flat.numel(), flat.device)
        g = st.residual.add_(flat)
        idx = self.select(g, st)
        values = g[idx]
        g[idx] = 0  # what is sent leaves the residual; the rest stays
        st.step += 1
        wire_idx = idx.to(torch.int32) if flat.numel() < 2 ** 31 else idx  # 4 bytes per index on the wire
        self._sent[bucket.index] = (wire_idx, values)
        return flat

    def select(self, g: torch.Tensor, st: _Sparse) -> torch.Tensor:
        """Indices to send: the exact top-k at recompute steps (setting H), else |g| ≥ H."""
        magnitude = g.abs()
        if st.step % self.reuse == 0:
            top = torch.topk(magnitude, self.k(g.numel()), sorted=False)
            st.threshold = float(top.values.min())
            return top.indices
        keep = magnitude >= st.threshold if st.threshold > 0 else magnitude > 0  # H = 0: nothing is zero-worthy
        return torch.nonzero(keep).view(-1)

    def communicate(self, wire: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        idx, values = self._sent[bucket.index]
        all_idx, all_val, sent = allgather_sparse(idx, values, channel.group)
        self._sent[bucket.index] = (all_idx, all_val)
        return sent

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        all_idx, all_val = self._sent.pop(bucket.index)
        mean_of_sparse(out, all_idx, all_val)

    def state_dict(self) -> dict:
        return {"buckets": {i: {"residual": s.residual, "threshold": s.threshold, "step": s.step}
                            for i, s in self._state.items()}}

    def load_state_dict(self, state: dict) -> None:
        self._state = {}
        for i, saved in state["buckets"].items():
            st = self._state[int(i)] = _Sparse(saved["residual"].numel(), saved["residual"].device)
            st.residual.copy_(saved["residual"])
            st.threshold, st.step = float(saved["threshold"]), int(saved["step"])
