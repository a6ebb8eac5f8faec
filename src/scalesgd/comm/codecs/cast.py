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
        self._counts = torch.zeros(2, dtype=torch.float64)  # elements, overflowed to inf by the cast

    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        if self.wire_dtype is None or self.wire_dtype == flat.dtype:
            return flat.div_(channel.world_size)
        wire = flat.to(self.wire_dtype)
        overflowed = torch.isinf(wire).sum() - torch.isinf(flat).sum()  # finite before the cast, inf after
        self._counts += torch.stack([torch.tensor(float(flat.numel())), overflowed.double().cpu()])
        return wire.div_(channel.world_size)

    def counters(self) -> dict[str, float]:
        elements, overflowed = self._counts.tolist()
        self._counts.zero_()
        return {f"{self.name}_overflow": overflowed / elements} if elements else {}

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
