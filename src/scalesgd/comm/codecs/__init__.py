"""Codecs by name: each turns a bucket of gradients into what travels, and back."""

from __future__ import annotations

import torch

from scalesgd.comm.codecs.base import BucketView, Codec, Exchange
from scalesgd.comm.codecs.cast import CastCodec

CODECS = ("fp32", "fp16", "bf16")


def make_codec(name: str) -> Codec:
    """A fresh codec instance (codecs may hold per-run state)."""
    if name == "fp32":
        return CastCodec("fp32", None)
    if name == "fp16":
        return CastCodec("fp16", torch.float16)
    if name == "bf16":
        return CastCodec("bf16", torch.bfloat16)
    raise ValueError(f"unknown codec {name!r}; choose from {', '.join(CODECS)}")


__all__ = ["CODECS", "BucketView", "Codec", "Exchange", "make_codec"]
