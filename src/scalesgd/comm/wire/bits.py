"""Bits packed eight to a byte: 1-bit Adam's signs and the compact sparse wire's bitmaps.

Element i sits in bit i % 8 of byte i // 8; the last byte is padded with zeros.
"""

from __future__ import annotations

import torch

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    """0 … 7 as uint8 on `device`: the bit of each element of a byte."""
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(8, dtype=torch.uint8, device=device)
    return shifts


def pack(bits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`bits` (bool, any length) packed eight to a uint8, the last byte padded with zeros; into `out` if given."""
    n = bits.numel()
    padded = torch.zeros(-(-n // 8) * 8, dtype=torch.uint8, device=bits.device)
    padded[:n] = bits.reshape(-1)
    packed = (padded.view(-1, 8) << _shifts(bits.device)).sum(1, dtype=torch.uint8)
    if out is None:
        return packed
    out.copy_(packed)
    return out


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first `n` bits of `packed` (uint8) as a bool tensor."""
    return ((packed.view(-1, 1) >> _shifts(packed.device)) & 1).view(-1)[:n].bool()
