"""Uncompressed (fp32) and 16-bit (fp16, bf16) exchange: cast, sum, cast back."""

from __future__ import annotations

import torch

from scalesgd.comm.codecs.base import BucketView, Channel, Codec


class CastCodec(Codec):
    """Send the bucket as `wire_dtype`, divided by the world size first so the sum cannot overflow.

    With the bucket's own dtype this is the uncompressed exchange and works in place; with fp16 it
    is the same arithmetic as PyTorch's `fp16_compress_hook`.
    """

    def __init__(self, name: str, wire_dtype: torch.dtype | None):
        self.name = name
        self.wire_dtype = wire_dtype

    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        if self.wire_dtype is None or self.wire_dtype == flat.dtype:
            return flat.div_(channel.world_size)
        return flat.to(self.wire_dtype).div_(channel.world_size)

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
