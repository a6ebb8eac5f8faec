"""How a rank's sparse entries travel: plainly (an int32 index and a float32 value, 8 bytes an entry), or compactly
(at most 4 bytes an entry).

Compact: the values in fp16 (the codec sends only values fp16 holds exactly, keeping the rounding in its residual),
and the indices, sorted, in whichever form is smaller:
- blocks: each index's low 16 bits (its place in its block of 65,536 elements), with the count of entries in each
  block of the bucket as int32: 2 bytes an entry and 4 bytes per 65,536 elements of the bucket;
- a bitmap of the bucket, one bit an element: n/8 bytes, smaller from a density of about 1/16 on.

The message is one uint8 tensor: a 4-byte header (the form), then the form's index part padded to 4 bytes, then the
values. Every section starts on a multiple of its element size, so each is read in place as its dtype.
"""

from __future__ import annotations

import torch

from scalesgd.comm.wire.bits import pack, unpack

BLOCK = 1 << 16  # elements a 16-bit offset reaches
FP16_MAX = 65504.0  # the largest finite fp16: a value beyond it is sent as this, the rest kept by the codec
_BLOCKS, _BITMAP = 0, 1  # the header's forms
HEADER = 4


def _blocks(numel: int) -> int:
    return -(-numel // BLOCK)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 4) * 4


def compact_size(entries: int, numel: int) -> int:
    """Bytes of the compact message of `entries` entries of a bucket of `numel` elements."""
    return HEADER + min(4 * _blocks(numel) + _aligned(2 * entries), _aligned(-(-numel // 8))) + 2 * entries


class SparseWire:
    """The plain form: (int32 indices, float32 values) travel as they are."""

    name = "plain"

    def encode(self, indices: torch.Tensor, values: torch.Tensor, numel: int) -> tuple[torch.Tensor, ...]:
        return indices, values

    def decode(self, parts: tuple[torch.Tensor, ...], numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        return parts[0], parts[1]

    def like(self, indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Empty tensors of the dtypes `encode`'s parts have, for receiving."""
        return indices.new_empty(0), values.new_empty(0)


class CompactWire(SparseWire):
    """The compact form: one uint8 message, ≤ 4 bytes an entry (blocks or bitmap, fp16 values)."""

    name = "compact"

    def encode(self, indices: torch.Tensor, values: torch.Tensor, numel: int) -> tuple[torch.Tensor, ...]:
        order = torch.argsort(indices)
        idx, half = indices[order].long(), values[order].to(torch.float16)
        k, device = idx.numel(), idx.device
        blocks = 4 * _blocks(numel) + _aligned(2 * k)
        bitmap = _aligned(-(-numel // 8))
        form = _BLOCKS if blocks <= bitmap else _BITMAP
        message = torch.zeros(HEADER + min(blocks, bitmap) + 2 * k, dtype=torch.uint8, device=device)
        message[0] = form
        body = message[HEADER:HEADER + min(blocks, bitmap)]
        if form == _BLOCKS:
            counts = torch.bincount(idx >> 16, minlength=_blocks(numel)).to(torch.int32)
            body[:4 * counts.numel()].view(torch.int32).copy_(counts)
            body[4 * counts.numel():4 * counts.numel() + 2 * k].view(torch.int16).copy_((idx & 0xFFFF).to(torch.int16))
        else:
            bits = torch.zeros(numel, dtype=torch.bool, device=device)
            bits[idx] = True
            pack(bits, out=body[:-(-numel // 8)])
        message[HEADER + min(blocks, bitmap):].view(torch.float16).copy_(half)
        return (message,)

    def decode(self, parts: tuple[torch.Tensor, ...], numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        (message,) = parts
        form = int(message[0])
        if form == _BLOCKS:
            nblocks = _blocks(numel)
            k = (message.numel() - HEADER - 4 * nblocks) // 4
            body = message[HEADER:HEADER + 4 * nblocks + _aligned(2 * k)]
            counts = body[:4 * nblocks].view(torch.int32).long()
            low = body[4 * nblocks:4 * nblocks + 2 * k].view(torch.int16).long() & 0xFFFF
            block = torch.repeat_interleave(torch.arange(nblocks, device=message.device), counts)
            idx = (block << 16) | low
            start = HEADER + 4 * nblocks + _aligned(2 * k)
        else:
            bitmap = _aligned(-(-numel // 8))
            idx = torch.nonzero(unpack(message[HEADER:HEADER + bitmap], numel)).view(-1)
            start = HEADER + bitmap
        return idx, message[start:].view(torch.float16).float()

    def like(self, indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (indices.new_empty(0, dtype=torch.uint8),)


PLAIN, COMPACT = SparseWire(), CompactWire()
SPARSE_WIRES = {"compact": COMPACT, "plain": PLAIN}
