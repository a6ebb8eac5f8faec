"""Codecs by name: each turns a bucket of gradients into what travels, and back (`base.Codec`, the contract the
engine drives). The registries (`registry.CODECS`, `registry.CODEC_OPTIONS`) are the one list of codecs and their
options; each codec's module registers it: `cast` (fp32, fp16, bf16), `pytorch` (PowerSGD, PyTorch's own hook),
`fp8/` (fp8 and its ablations), `topk/` (topk, topk-global, topk-nodes, lags), `lowrank/` (PowerSGD's
algorithm as ours), `onebit/` (1-bit Adam's), `sparseloco/` (SparseLoCo's sparse two-bit pseudo-gradients).
"""

from scalesgd.comm.codecs import cast, fp8, lowrank, onebit, pytorch, sparseloco, topk  # noqa: F401  (each registers its codecs)
from scalesgd.comm.codecs.base import BucketView, Channel, Codec, Exchange, Piece, Scratch
from scalesgd.comm.codecs.cast import CastCodec
from scalesgd.comm.codecs.fp8.codec import Fp8Codec
from scalesgd.comm.codecs.fp8.ranges import Fp8Options
from scalesgd.comm.codecs.lowrank import LowrankCodec, LowrankOptions
from scalesgd.comm.codecs.pytorch import DdpHook
from scalesgd.comm.codecs.registry import CODEC_OPTIONS, CODECS, CodecEntry, CodecOptions, CodecSettings, make_codec
from scalesgd.comm.codecs.topk.codec import DgcOptions, TopkCodec, TopkOptions
from scalesgd.comm.codecs.topk.nodes import NodeTopkCodec

__all__ = ["CODECS", "CODEC_OPTIONS", "BucketView", "CastCodec", "Channel", "Codec", "CodecEntry", "CodecOptions",
           "CodecSettings", "DdpHook", "DgcOptions", "Exchange", "Fp8Codec", "Fp8Options", "LowrankCodec",
           "LowrankOptions", "NodeTopkCodec", "Piece",
           "Scratch", "TopkCodec", "TopkOptions", "make_codec"]
