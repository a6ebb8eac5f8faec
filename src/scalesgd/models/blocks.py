"""Pieces the residual networks share."""

from __future__ import annotations

from torch import nn


def shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Module:
    """Identity when shapes match, else a strided 1x1 convolution with BN (He et al.'s option B)."""
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))
