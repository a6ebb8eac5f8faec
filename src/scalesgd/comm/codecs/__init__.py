"""Codecs by name: each turns a bucket of gradients into what travels, and back.

The registry `CODECS` is the one list of codecs: the command line's choices and help, validation,
`bench` mode names and the engines' wiring all read it. Adding a codec is its module plus one
`CODECS.add(name, CodecEntry(…))`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scalesgd.comm.codecs import pytorch as torch_hooks
from scalesgd.comm.codecs.base import BucketView, Channel, Codec, Exchange, Piece, Scratch
from scalesgd.comm.codecs.cast import CastCodec
from scalesgd.comm.codecs.fp8.codec import Fp8Codec
from scalesgd.comm.codecs.fp8.ranges import Fp8Options
from scalesgd.comm.codecs.pytorch import DdpHook
from scalesgd.comm.codecs.topk import codec as topk
from scalesgd.comm.codecs.topk.codec import DgcOptions, TopkCodec
from scalesgd.comm.codecs.topk.nodes import NodeTopkCodec
from scalesgd.registry import Registry


@dataclass(frozen=True)
class CodecSettings:
    """What codecs are built with: fp8's range options, the sparse density, threshold reuse and DGC's
    corrections, and a seed."""

    fp8: Fp8Options = field(default_factory=Fp8Options)
    density: float = 0.1
    topk_reuse: int = 10
    seed: int = 0
    dgc: DgcOptions = field(default_factory=DgcOptions)

    def problems(self) -> dict[str, str]:
        """Setting → what is wrong with it, named as the train options are (fp8_eps, density, …)."""
        sparse = topk.problems(self.density, self.topk_reuse)
        return ({f"fp8_{name}": problem for name, problem in self.fp8.problems().items()}
                | {"topk_reuse" if name == "reuse" else name: problem for name, problem in sparse.items()})


@dataclass(frozen=True)
class CodecEntry:
    """A codec's registration: how to build it, and what the engines and the validation must know of it."""

    help: str
    build: Callable[[CodecSettings], Codec] | None  # None: only a PyTorch hook under DDP stands for it
    engines: tuple[str, ...] | None = None  # the engines that take it (None: every one)
    torch_hook: Callable[[bool], DdpHook | None] | None = None  # under DDP, PyTorch's own instead of ours
    needs_topology: bool = False  # its sum runs in the node and cross-node groups
    buckets: str | None = None  # the bucket plan it implies (None: --buckets or the planner decides)
    sparse: bool = False  # sends (index, value) pairs
    warm_start: int = 0  # plain (uncompressed) iterations it starts with of its own (PowerSGD's start_powerSGD_iter)
    wire_bytes: float | None = None  # a dense codec's bytes per element on the wire (what the simulator costs)

    def runs_on(self, engine: str) -> bool:
        return self.engines is None or engine in self.engines

    @property
    def simulated(self) -> bool:
        """Whether `scalesgd simulate` has a cost model for it: a dense codec of known width, or a sparse one."""
        return self.wire_bytes is not None or self.sparse

    @property
    def plannable(self) -> bool:
        """Whether the planner may merge layers into this codec's groups: sparse over all ranks (its timing model),
        with no bucket rule of its own."""
        return self.sparse and self.buckets is None and not self.needs_topology


CODECS: Registry[CodecEntry] = Registry("codec")


def make_codec(name: str, settings: CodecSettings | None = None) -> Codec:
    """A fresh instance of the registered codec `name` (codecs may hold per-run state)."""
    entry = CODECS[name]
    if entry.build is None:
        raise ValueError(f"codec {name!r} has no scalesgd implementation: under DDP it is PyTorch's own hook")
    return entry.build(settings or CodecSettings())


def _fp8(name: str, relative: bool, two_stage: bool) -> Callable[[CodecSettings], Codec]:
    return lambda s: Fp8Codec(name, relative=relative, two_stage=two_stage, options=s.fp8, seed=s.seed)


CODECS.add("fp32", CodecEntry("uncompressed", lambda s: CastCodec("fp32", None), torch_hook=torch_hooks.builtin,
                              wire_bytes=4))
CODECS.add("fp16", CodecEntry("half precision (with ddp: PyTorch's fp16_compress_hook)",
                              lambda s: CastCodec("fp16", torch.float16), torch_hook=torch_hooks.fp16, wire_bytes=2))
CODECS.add("bf16", CodecEntry("bfloat16 (with ddp: PyTorch's bf16_compress_hook)",
                              lambda s: CastCodec("bf16", torch.bfloat16), torch_hook=torch_hooks.bf16, wire_bytes=2))
CODECS.add("powersgd", CodecEntry("PyTorch's PowerSGD hook, rank 4", None, engines=("ddp",),
                                  torch_hook=torch_hooks.powersgd, warm_start=torch_hooks.POWERSGD_START_ITER))
CODECS.add("fp8", CodecEntry("e5m2 relative to the weights, summed in two stages (SPEC §2)",
                             _fp8("fp8", relative=True, two_stage=True), needs_topology=True, wire_bytes=1))
CODECS.add("fp8-direct", CodecEntry("ablation: the gradient itself in e5m2",
                                    _fp8("fp8-direct", relative=False, two_stage=True), needs_topology=True,
                                    wire_bytes=1))
CODECS.add("fp8-flat", CodecEntry("ablation: one fp8 ring over all ranks", _fp8("fp8-flat", relative=True,
                                                                                 two_stage=False), wire_bytes=1))
CODECS.add("topk", CodecEntry("DLGS: per-group top-k with residuals, thresholds reused (SPEC §3)",
                              lambda s: TopkCodec("topk", s.density, s.topk_reuse, s.dgc), sparse=True))
CODECS.add("topk-global", CodecEntry("one exact top-k over all gradients each step",
                                     lambda s: TopkCodec("topk-global", s.density, 1, s.dgc), buckets="single",
                                     sparse=True))
CODECS.add("topk-nodes", CodecEntry("top-k across nodes only: summed densely inside each node, each local rank's "
                                    "shard sparsified between nodes", lambda s: NodeTopkCodec(
                                        "topk-nodes", s.density, s.topk_reuse, s.dgc),
                                    needs_topology=True, sparse=True))
CODECS.add("lags", CodecEntry("an exact top-k per layer each step", lambda s: TopkCodec("lags", s.density, 1, s.dgc),
                              buckets="layer", sparse=True))

__all__ = ["CODECS", "BucketView", "Channel", "Codec", "CodecEntry", "CodecSettings", "DdpHook", "DgcOptions",
           "Exchange", "Fp8Codec", "Fp8Options", "NodeTopkCodec", "Piece", "Scratch", "TopkCodec", "make_codec"]
