"""SparseLoCo's pseudo-gradient exchange (Sarfi et al. 2025, "Communication Efficient LLM Pre-training with
SparseLoCo"): each rank's error feedback e ← β·e + Δ, a chunked top-k of e at two bits an entry travels
(`scalesgd.comm.wire.chunked`), what did not travel (and the rounding of what did) stays in e. The decayed error
feedback stands in for DiLoCo's outer momentum, so the outer step is plain averaging (the registration's recipe:
outer lr 1, no momentum)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scalesgd import checks
from scalesgd.comm.codecs.base import BucketView
from scalesgd.comm.codecs.topk.codec import TopkCodec
from scalesgd.comm.wire.chunked import ChunkWire
from scalesgd.options import option


@dataclass(frozen=True)
class SparseLocoOptions:
    """How much of each chunk travels, and how long an entry left behind is remembered."""

    chunk: int = option(4096, "sparseloco: elements a chunk (each chunk sends its own top entries; offsets travel "
                        "in log2(chunk) bits)", check=checks.at_least(2), own=True)
    top: int = option(64, "sparseloco: entries each chunk sends (64 of 4096: 1.56 %, SparseLoCo's; the chunk or "
                      "more: all)",
                      check=checks.at_least(1), own=True)
    decay: float = option(0.95, "sparseloco: the error feedback's decay β (e ← β·e + Δ each round; it stands in for "
                          "the outer momentum)", check=checks.within(0, 1), own=True)


class SparseLocoCodec(TopkCodec):
    """Top-k's exchange and state (each rank's residual, its own: a joiner's starts at zero), with SparseLoCo's
    decayed error feedback and its chunked two-bit wire."""

    def __init__(self, name: str = "sparseloco", options: SparseLocoOptions = SparseLocoOptions()):
        super().__init__(name, options.top / options.chunk, reuse=1)
        self.decay = options.decay
        self.wire = ChunkWire(options.chunk, options.top)

    def sparsify(self, flat: torch.Tensor, bucket: BucketView, ranks: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        held, st = self._bucket(bucket, flat)
        st.step += 1
        if not bool(torch.isfinite(flat).all()):
            return flat.new_empty(0, dtype=torch.int32), flat.new_empty(0), True
        residual = held.tensors["residual"]
        gradient_sq = flat.square().sum()
        v = residual.mul_(self.decay).add_(flat)
        idx = self.wire.select(v)
        sent = self.wire.quantize(v[idx], v.numel())
        v[idx] -= sent
        self._counts += torch.stack([torch.tensor(float(idx.numel())), torch.tensor(float(flat.numel())),
                                     v.square().sum().double().cpu(), gradient_sq.double().cpu()])
        return idx.to(torch.int32) if flat.numel() < 2 ** 31 else idx, sent, False
