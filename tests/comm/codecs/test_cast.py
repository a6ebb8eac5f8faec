"""The 16-bit casts: PyTorch's fp16 hook arithmetic, and the overflow counter."""

import math

import torch

from scalesgd.comm.codecs import BucketView, Channel, make_codec

ALONE = Channel(None, 2)  # encode only: no collective runs


def test_fp16_counts_only_what_the_cast_overflowed():
    codec = make_codec("fp16")
    flat = torch.tensor([1e5, -7e4, 1.0, math.inf, math.nan, 65504.0])
    wire = codec.encode(flat.clone(), BucketView(0, [flat]), ALONE)
    assert wire.dtype == torch.float16
    assert wire[2] == 0.5 and wire[5] == 32752.0  # ÷ world after the cast, as fp16_compress_hook
    assert codec.counters() == {"fp16_overflow": 2 / 6}  # 1e5 and -7e4; the inf was one already, NaN is not inf
    codec.encode(torch.randn(1000), BucketView(0, [flat]), ALONE)
    assert codec.counters() == {"fp16_overflow": 0.0}
    assert codec.counters() == {}


def test_bf16_has_fp32_s_range_and_fp32_sends_in_place():
    codec = make_codec("bf16")
    codec.encode(torch.tensor([1e30, 1.0]), BucketView(0, []), ALONE)
    assert codec.counters() == {"bf16_overflow": 0.0}
    flat = torch.ones(4)
    assert make_codec("fp32").encode(flat, BucketView(0, []), ALONE) is flat
