"""The 16-bit casts: PyTorch's fp16 hook arithmetic, and the overflow counter."""

import math

import torch

from scalesgd.comm.codecs import BucketView, Channel, Piece, Scratch, make_codec

ALONE = Channel(None, 2)  # encode only: no collective runs


def encoded(codec, flat):
    """The wire after every piece of `flat` is encoded."""
    exchange = codec.start(flat, BucketView(0, []), ALONE, Scratch())
    for i in range(exchange.pieces):
        exchange.encode(Piece(i))
    return exchange.wire


def test_fp16_counts_only_what_the_cast_overflowed():
    codec = make_codec("fp16")
    wire = encoded(codec, torch.tensor([1e5, -7e4, 1.0, math.inf, math.nan, 65504.0]))
    assert wire.dtype == torch.float16
    assert wire[2] == 0.5 and wire[5] == 32752.0  # ÷ world after the cast, as fp16_compress_hook
    assert codec.counters() == {"fp16_overflow": 2 / 6}  # 1e5 and -7e4; the inf was one already, NaN is not inf
    encoded(codec, torch.randn(1000))
    assert codec.counters() == {"fp16_overflow": 0.0}
    assert codec.counters() == {}


def test_bf16_has_fp32_s_range_and_fp32_sends_in_place():
    codec = make_codec("bf16")
    encoded(codec, torch.tensor([1e30, 1.0]))
    assert codec.counters() == {"bf16_overflow": 0.0}
    flat = torch.ones(4)
    assert encoded(make_codec("fp32"), flat) is flat and torch.equal(flat, torch.full((4,), 0.5))


def test_a_large_bucket_is_cut_into_pieces_of_the_channel_s_bytes():
    channel = Channel(None, 2, piece_bytes=400)
    exchange = make_codec("fp16").start(torch.ones(450), BucketView(0, []), channel, Scratch())
    assert exchange.bounds == [(0, 200), (200, 400), (400, 450)]  # 200 fp16 elements in 400 bytes
