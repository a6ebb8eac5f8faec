"""Uncompressed (fp32) and 16-bit (fp16, bf16) exchange: cast, sum, cast back."""

from __future__ import annotations

import torch

from scalesgd.comm.codecs.base import BucketView, Channel, Codec


class CastCodec(Codec):
    """Send the bucket as `wire_dtype`, divided by the world size after the cast (PyTorch's order), and
    count the elements the cast overflowed to inf.

    With the bucket's own dtype this is the uncompressed exchange and works in place; with fp16 it
    is the same arithmetic as PyTorch's `fp16_compress_hook`.
    """

    def __init__(self, name: str, wire_dtype: torch.dtype | None):
        self.name = name
        self.wire_dtype = wire_dtype
        self._elements, self._overflowed = 0, 0

    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        if self.wire_dtype is None or self.wire_dtype == flat.dtype:
            return flat.div_(channel.world_size)
        wire = flat.to(self.wire_dtype)
        self._elements += flat.numel()
        if flat.numel():
            lo, hi = torch.aminmax(flat)  # one vectorised pass; counting infs costs 6× the cast, so only if needed
            if not torch.maximum(-lo, hi).item() <= torch.finfo(self.wire_dtype).max:  # (NaN: count too)
                self._overflowed += int(torch.isinf(wire).sum() - torch.isinf(flat).sum())  # finite before, inf after
        return wire.div_(channel.world_size)

    def counters(self) -> dict[str, float]:
        elements, overflowed = self._elements, self._overflowed
        self._elements, self._overflowed = 0, 0
        return {f"{self.name}_overflow": overflowed / elements} if elements else {}

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
