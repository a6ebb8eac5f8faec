"""Uncompressed (fp32) and 16-bit (fp16, bf16) exchange: cast, sum, cast back; registered with the PyTorch hook that
stands for each under DDP (and PyTorch's PowerSGD, which has no cast of ours)."""

from __future__ import annotations

import torch

from scalesgd.comm.codecs import pytorch as torch_hooks
from scalesgd.comm.codecs.base import BucketView, Channel, Codec, Exchange, Piece, Scratch, own_row
from scalesgd.comm.codecs.registry import CODECS, SHARDED_TOO, CodecEntry, DenseCost, LowRankCost
from scalesgd.comm.wire.collectives import ring_reduce_scatter_rows_steps
from scalesgd.comm.wire.pipeline import Steps


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

    def start(self, flat: torch.Tensor, bucket: BucketView, channel: Channel, scratch: Scratch) -> Exchange:
        in_place = self.wire_dtype is None or self.wire_dtype == flat.dtype
        wire = flat if in_place else scratch.tensor("wire", flat.numel(), self.wire_dtype, flat.device)
        return CastExchange(self, flat, wire, channel)

    def counters(self) -> dict[str, float]:
        elements, overflowed = self._elements, self._overflowed
        self._elements, self._overflowed = 0, 0
        return {f"{self.name}_overflow": overflowed / elements} if elements else {}

    def count_overflow(self, part: torch.Tensor, wire: torch.Tensor) -> None:
        """Count the elements of `part` that were finite and are inf on the `wire` after the cast."""
        self._elements += part.numel()
        if part.numel():
            lo, hi = torch.aminmax(part)  # one vectorised pass; counting infs costs 6× the cast, so only if needed
            if not torch.maximum(-lo, hi).item() <= torch.finfo(wire.dtype).max:  # (NaN: count too)
                self._overflowed += int(torch.isinf(wire).sum() - torch.isinf(part).sum())


DENSE = CastCodec("fp32", None)  # the uncompressed exchange a compressing codec or the engine falls back to


class CastExchange(Exchange):
    """Each piece: cast into the wire (or divide in place), allreduce with the channel's algorithm, cast back."""

    def __init__(self, codec: CastCodec, flat: torch.Tensor, wire: torch.Tensor, channel: Channel):
        self.codec, self.flat, self.wire, self.channel = codec, flat, wire, channel
        self.bounds = [(0, flat.numel())] if channel.scatter else channel.bounds(flat.numel(), wire.element_size())

    def encode(self, piece: Piece) -> None:
        a, b = self.bounds[piece.index]
        wire = self.wire[a:b]
        if self.wire is not self.flat:
            wire.copy_(self.flat[a:b])
            self.codec.count_overflow(self.flat[a:b], wire)
        wire.div_(self.channel.world_size)

    def transfer(self, piece: Piece) -> Steps:
        a, b = self.bounds[piece.index]
        if self.channel.scatter:
            return ring_reduce_scatter_rows_steps(self.wire, self.channel.group, tag=piece.tag)
        return self.channel.allreduce_steps(self.wire[a:b], tag=piece.tag)

    def decode(self, piece: Piece) -> None:
        if self.wire is not self.flat:
            a, b = own_row(self.channel, self.flat.numel()) if self.channel.scatter else self.bounds[piece.index]
            self.flat[a:b].copy_(self.wire[a:b])


CODECS.add("fp32", CodecEntry("uncompressed", lambda s: CastCodec("fp32", None), torch_hook=torch_hooks.builtin,
                              cost=lambda o: DenseCost(4), engines=SHARDED_TOO, scatters=True, cast=torch.float32))
CODECS.add("fp16", CodecEntry("half precision (with ddp: PyTorch's fp16_compress_hook)",
                              lambda s: CastCodec("fp16", torch.float16), torch_hook=torch_hooks.fp16,
                              cost=lambda o: DenseCost(2), engines=SHARDED_TOO, scatters=True,
                              cast=torch.float16))
CODECS.add("bf16", CodecEntry("bfloat16 (with ddp: PyTorch's bf16_compress_hook)",
                              lambda s: CastCodec("bf16", torch.bfloat16), torch_hook=torch_hooks.bf16,
                              cost=lambda o: DenseCost(2), torch_hook_needs_cuda=True, engines=SHARDED_TOO,
                              scatters=True, cast=torch.bfloat16))
# PowerSGD has no cast of ours: under DDP it is PyTorch's own hook, as each cast is; it takes the lowrank family's rank
# and compression rule, sums P, Q and the uncompressed tensors one after another in fp32, and our lowrank does its work
CODECS.add("powersgd", CodecEntry("PyTorch's PowerSGD hook at --rank (4); ours, on both engines, is lowrank", None,
                                  engines=("ddp",), torch_hook=torch_hooks.powersgd,
                                  warm_start=torch_hooks.POWERSGD_START_ITER, amount="rank", cost_proxy="lowrank",
                                  cost=lambda o: LowRankCost(3, o["lowrank"].rank, o["lowrank"].min_rate, 4)))
