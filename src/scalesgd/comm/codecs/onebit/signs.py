"""What 1-bit Adam sends for a vector (Tang, Gan, Rajbhandari, Lian, Zhang, Liu and He 2021, "1-bit Adam:
Communication Efficient Large-Scale Training with Adam's Convergence Speed"): each element's sign as one bit,
and per chunk of elements one scale ‖x‖₂/√n, so that the chunk decompresses to ±scale with the chunk's norm.

One message carries one part of a bucket: its chunks' scales as float32 bytes, then the signs packed eight to
a byte (element i in bit i % 8 of byte i // 8, the last byte padded with zeros), then one flag byte (1: some
rank's values were not finite). Both ends compute a message's size from the part's length alone. A sign bit
is 1 for x ≥ 0, so 0 (and −0) decompresses to +scale: a chunk of zeros has scale 0 and comes back exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalesgd.comm.wire.bits import pack, unpack


def chunk_scales(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """‖x_c‖₂/√len(x_c) of each run x_c of `chunk` elements of `x` (the last one shorter), as float32."""
    n = x.numel()
    full = n // chunk * chunk
    parts = [x[:full].view(-1, chunk).norm(dim=1).div_(math.sqrt(chunk))] if full else []
    if full < n:
        parts.append(x[full:].norm().div(math.sqrt(n - full)).view(1))
    return torch.cat(parts).float() if parts else x.new_zeros(0, dtype=torch.float32)


@dataclass(frozen=True)
class Message:
    """The layout of one part of `length` elements with a scale per `chunk` of them: scales, signs, flag."""

    length: int
    chunk: int

    @property
    def scales(self) -> int:
        return -(-self.length // self.chunk)

    @property
    def size(self) -> int:
        """Bytes on the wire."""
        return 4 * self.scales + -(-self.length // 8) + 1

    def write(self, x: torch.Tensor, wire: torch.Tensor) -> torch.Tensor:
        """Compress `x` into `wire` (its `size` bytes; the flag byte is left as it is); returns the scales."""
        scales = chunk_scales(x, self.chunk)
        wire[:4 * self.scales].copy_(scales.view(torch.uint8))
        pack(x >= 0, out=wire[4 * self.scales:self.size - 1])
        return scales

    def read(self, wire: torch.Tensor, out: torch.Tensor) -> None:
        """Decompress `wire` into `out` (`length` elements): ±scale of each element's chunk."""
        scales = wire[:4 * self.scales].clone().view(torch.float32).to(out.dtype)
        out.copy_(unpack(wire[4 * self.scales:self.size - 1], self.length))
        out.mul_(2).sub_(1)
        full = self.length // self.chunk
        if full:
            out[:full * self.chunk].view(full, self.chunk).mul_(scales[:full, None])
        if full * self.chunk < self.length:
            out[full * self.chunk:].mul_(scales[-1])

    def flag(self, wire: torch.Tensor) -> torch.Tensor:
        """The flag byte of the message in `wire` (a view: write it, or read it)."""
        return wire[self.size - 1:self.size]
