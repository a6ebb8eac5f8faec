"""Codecs by name: each turns a bucket of gradients into what travels, and back."""

from __future__ import annotations

import torch

from scalesgd.comm.codecs.base import BucketView, Codec, Exchange
from scalesgd.comm.codecs.cast import CastCodec
from scalesgd.comm.codecs.fp8 import Fp8Codec, Fp8Options
from scalesgd.comm.codecs.topk import TopkCodec

CODECS = ("fp32", "fp16", "bf16", "fp8", "fp8-direct", "fp8-flat", "topk", "topk-global", "lags")
# Sparse codecs and the bucket plan each implies (None: the plan given, or the planner's)
SPARSE_PLANS = {"topk": None, "topk-global": "single", "lags": "layer"}
FP8_VARIANTS = {"fp8": dict(relative=True, two_stage=True),  # SPEC §2
                "fp8-direct": dict(relative=False, two_stage=True),  # ablation: the gradient itself
                "fp8-flat": dict(relative=True, two_stage=False)}  # ablation: one ring over all ranks


def make_codec(name: str, fp8_options: Fp8Options | None = None, seed: int = 0, density: float = 0.1,
               topk_reuse: int = 10) -> Codec:
    """A fresh codec instance (codecs may hold per-run state).

    `topk` (DLGS) reuses each bucket's threshold for `topk_reuse` steps; `topk-global` and `lags`
    take an exact top-k every step (on one bucket of everything, and per layer).
    """
    if name == "fp32":
        return CastCodec("fp32", None)
    if name == "fp16":
        return CastCodec("fp16", torch.float16)
    if name == "bf16":
        return CastCodec("bf16", torch.bfloat16)
    if name in FP8_VARIANTS:
        return Fp8Codec(name, options=fp8_options or Fp8Options(), seed=seed, **FP8_VARIANTS[name])
    if name in SPARSE_PLANS:
        return TopkCodec(name, density, topk_reuse if name == "topk" else 1)
    raise ValueError(f"unknown codec {name!r}; choose from {', '.join(CODECS)}")


__all__ = ["CODECS", "SPARSE_PLANS", "BucketView", "Codec", "Exchange", "Fp8Codec", "Fp8Options", "TopkCodec",
           "make_codec"]
