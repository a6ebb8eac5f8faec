"""A chunked top-k at two bits an entry, as SparseLoCo sends its pseudo-gradients (Sarfi et al. 2025,
"Communication Efficient LLM Pre-training with SparseLoCo"): each chunk of `chunk`
elements of a bucket sends its `top` largest entries, each as its offset in the chunk (⌈log2 chunk⌉ bits) and one of
four values, ±lo or ±hi, the chunk's two magnitudes (fp16): its larger half of entries at the mean magnitude of that
half, the rest at theirs.

Every rank knows how many entries each chunk sends (`top`, the last chunk at most its length), and the entries of a
chunk travel largest first, so an entry's magnitude bit is its place and only its sign travels: a message is the
chunks' levels (4 bytes a chunk), then the offsets' bits, then the signs' bits — about 1.7 bytes an entry at the
defaults (4096, 64), against the compact wire's 4.
"""

from __future__ import annotations

import torch

from scalesgd.comm.wire.bits import pack, unpack
from scalesgd.comm.wire.compact import FP16_MAX, SparseWire


class ChunkWire(SparseWire):
    """The chunked two-bit form: `select` the entries in the wire's order, `quantize` them to what travels, then
    `encode`/`decode` as every sparse wire does."""

    name = "chunk2"

    def __init__(self, chunk: int = 4096, top: int = 64):
        if chunk < 1 or top < 1:
            raise ValueError(f"chunk {chunk}, top {top}: give at least 1 of each")
        self.chunk, self.top = chunk, min(top, chunk)  # a top of the chunk or more: every entry travels
        self.offset_bits = max(1, (chunk - 1).bit_length())

    # ---- how many, and which -----------------------------------------------------------------------------
    def counts(self, numel: int, device=None) -> torch.Tensor:
        """Entries each chunk of a bucket of `numel` elements sends (int64)."""
        chunks = -(-numel // self.chunk)
        counts = torch.full((chunks,), self.top, dtype=torch.int64, device=device)
        if chunks:
            counts[-1] = min(self.top, numel - (chunks - 1) * self.chunk)
        return counts

    def entry_bytes(self) -> float:
        """Bytes an entry costs on the wire: its offset's and sign's bits and its share of its chunk's levels."""
        return (self.offset_bits + 1) / 8 + 4 / self.top

    def message_bytes(self, numel: int) -> int:
        chunks = -(-numel // self.chunk)
        entries = int(self.counts(numel).sum()) if numel else 0
        return 4 * chunks + -(-entries * self.offset_bits // 8) + -(-entries // 8)

    def select(self, v: torch.Tensor) -> torch.Tensor:
        """The indices of each chunk's `top` largest |v|, chunk by chunk, largest first: the wire's order."""
        numel = v.numel()
        if numel == 0:
            return torch.zeros(0, dtype=torch.int64, device=v.device)
        chunks = -(-numel // self.chunk)
        magnitude = v.abs()
        pad = chunks * self.chunk - numel
        if pad:  # never chosen before a real element (magnitudes are ≥ 0)
            magnitude = torch.cat([magnitude, magnitude.new_full((pad,), -1.0)])
        offsets = torch.topk(magnitude.view(chunks, self.chunk), self.top, dim=1, sorted=True).indices
        idx = offsets + torch.arange(chunks, device=v.device).unsqueeze(1) * self.chunk
        last = int(self.counts(numel)[-1])
        return torch.cat([idx[:-1].reshape(-1), idx[-1, :last]])

    def _places(self, numel: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each entry's chunk, and whether it is in its chunk's larger half (the wire's order)."""
        counts = self.counts(numel, device)
        chunk_of = torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts)
        first = torch.cumsum(counts, 0) - counts
        place = torch.arange(chunk_of.numel(), device=device) - first[chunk_of]
        return chunk_of, place < (counts + 1).div(2, rounding_mode="floor")[chunk_of]

    def quantize(self, values: torch.Tensor, numel: int) -> torch.Tensor:
        """What travels for `values` (in the wire's order): ±hi for each chunk's larger half, ±lo for the rest, each
        level the mean magnitude of its half, rounded to fp16 (the caller keeps the difference)."""
        if values.numel() == 0:
            return values.clone()
        chunk_of, upper = self._places(numel, values.device)
        slot = chunk_of * 2 + (~upper).long()  # [hi, lo] of each chunk
        chunks = -(-numel // self.chunk)
        sums = torch.zeros(2 * chunks, dtype=torch.float32, device=values.device).index_add_(
            0, slot, values.abs().float())
        sizes = torch.zeros(2 * chunks, dtype=torch.float32, device=values.device).index_add_(
            0, slot, torch.ones_like(values, dtype=torch.float32))
        levels = (sums / sizes.clamp(min=1)).clamp(max=FP16_MAX).half().float()
        magnitude = levels[slot].to(values.dtype)
        return torch.where(values >= 0, magnitude, -magnitude)

    # ---- on the wire ----------------------------------------------------------------------------------------
    def encode(self, indices: torch.Tensor, values: torch.Tensor, numel: int) -> tuple[torch.Tensor, ...]:
        """One uint8 message of entries `quantize` gave, in `select`'s order; empty for none (a rank whose gradient
        was not finite sends nothing, and its flag makes the mean NaN)."""
        device = values.device
        if indices.numel() == 0:
            return (torch.zeros(0, dtype=torch.uint8, device=device),)
        chunks = -(-numel // self.chunk)
        chunk_of, upper = self._places(numel, device)
        levels = torch.zeros(2 * chunks, dtype=torch.float16, device=device)
        slot = chunk_of * 2 + (~upper).long()
        levels[slot] = values.abs().half()  # every entry of a slot holds the same level
        offsets = indices.long() - chunk_of * self.chunk
        bits = (offsets.unsqueeze(1) >> torch.arange(self.offset_bits, device=device)) & 1
        parts = [levels.view(torch.uint8), pack(bits.view(-1).bool()), pack(values < 0)]
        return (torch.cat(parts),)

    def decode(self, parts: tuple[torch.Tensor, ...], numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        (message,) = parts
        device = message.device
        if message.numel() == 0:
            return torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(0, device=device)
        chunks = -(-numel // self.chunk)
        chunk_of, upper = self._places(numel, device)
        k = chunk_of.numel()
        levels = message[:4 * chunks].view(torch.float16).float()
        start = 4 * chunks
        offset_bytes = -(-k * self.offset_bits // 8)
        bits = unpack(message[start:start + offset_bytes], k * self.offset_bits).view(k, self.offset_bits)
        offsets = (bits.long() << torch.arange(self.offset_bits, device=device)).sum(1)
        negative = unpack(message[start + offset_bytes:], k)
        magnitude = levels[chunk_of * 2 + (~upper).long()]
        return chunk_of * self.chunk + offsets, torch.where(negative, -magnitude, magnitude)

    def like(self, indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (indices.new_empty(0, dtype=torch.uint8),)

