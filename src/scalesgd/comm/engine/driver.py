"""One bucket's exchange, run as its codec describes it: the one path both engines take, so every codec is
pipelined, timed and traced alike, with the engine's policies (dense first steps, gradient norms) around it.

    driver = BucketDriver(codec, channel)
    pending = driver.prepare(flat, view)   # where the bucket filled up (backward's thread)
    times = driver.complete(pending)       # on the communication thread: the mean is in `flat` after

`prepare` counts the bucket's step, and for a codec that encodes in backward starts and encodes it there;
`complete` starts the others (their start may be a collective), then keeps up to `depth` pieces in flight:
encode a piece, post its transfer, reduce as its steps come back, decode; then `finish`. Each part is a span
of the trace (encode, wire, reduce, decode) and counts in `Times`: arithmetic as codec time, waiting for
the wire as wire time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from scalesgd.comm.codecs.base import (
    BucketView,
    Channel,
    Codec,
    Exchange,
    Piece,
    Scratch,
    piece_steps,
)
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.codecs.registry import needs_topology
from scalesgd.comm.engine.policies import LOCAL, MEAN, DenseFirst, GradientNorms
from scalesgd.comm.wire.collectives import ALGORITHMS
from scalesgd.comm.wire.pipeline import DEPTH, TAGS, Steps, run_pipelined
from scalesgd.comm.wire.topology import Topology
from scalesgd.trace import Tracer, now_us


@dataclass
class Times:
    """Where one bucket's exchange went on this rank: seconds and bytes."""

    encode_s: float = 0.0  # encoding on the thread that prepared the bucket (backward's, for codecs that do)
    codec_s: float = 0.0  # arithmetic on the communication thread: start, encode, the sums' reduction, decode
    wire_s: float = 0.0  # the communication thread waiting for the wire
    bytes_sent: int = 0


@dataclass
class Pending:
    """A bucket prepared for this step: its buffer (where the mean goes), view, and its exchange once started."""

    flat: torch.Tensor
    view: BucketView
    codec: Codec  # the bucket's codec this step (the dense one in a dense-first step)
    exchange: Exchange | None = None  # None until started
    scale: float | None = None  # fp16's loss scale, divided out for a codec that keeps gradients (put back after)
    undoable: bool = False  # the step may not be taken (fp16's scaler skips it, a round does not commit)
    saved: tuple | None = None  # where undoable, (the codec's state before the step,): put back by `undo`
    encoded: bool = False  # every piece encoded already (in backward)
    times: Times = field(default_factory=Times)


class BucketDriver:
    """Runs buckets' exchanges with `codec` on `channel`: the bucket's scratch kept across steps, the pieces
    pipelined `depth` deep, every part timed and traced; the first `dense_steps` steps of each parameter dense,
    the squared norms counted into `norms` where given.

    Parameters are numbered in the order `bind` is given them (the model's order, so per-parameter state is keyed
    alike in every run whatever the buckets), else in the order first seen.
    """

    def __init__(self, codec: Codec, channel: Channel | None, tracer: Tracer | None = None, dense_steps: int = 0,
                 norms: GradientNorms | None = None, depth: int = DEPTH):
        if depth < 1:
            raise ValueError(f"pipeline depth {depth}: give at least 1")
        self.codec, self.channel, self.depth = codec, channel, depth
        self.tracer = tracer or Tracer(False)
        self.dense_first = DenseFirst(dense_steps) if dense_steps > 0 else None
        self.norms = norms
        self.loss_scale: Callable[[], float] | None = None  # fp16's gradient scaler's current scale, where there is one
        self._numbers: dict[int, int] = {}
        self._scratch: dict[int, Scratch] = {}

    @property
    def dense_steps(self) -> int:
        """The steps each parameter is exchanged dense before the codec takes over (0: none)."""
        return self.dense_first.steps if self.dense_first is not None else 0

    def follow(self, scaler) -> None:
        """Take fp16's gradient scaler into account (None, or one not enabled: there is none): its scale is divided
        out of what a codec keeps across steps, and a step it skips is undone in the codec."""
        self.loss_scale = scaler.get_scale if scaler is not None and scaler.is_enabled() else None

    # ---- parameters and buckets ------------------------------------------------------------------
    def bind(self, params: list[torch.Tensor]) -> None:
        """Number the model's parameters in the model's order."""
        self._numbers = {id(p): i for i, p in enumerate(params)}

    def key(self, param: torch.Tensor) -> int:
        """A parameter's number: its place in the bound model, else the order the driver first saw it."""
        return self._numbers.setdefault(id(param), len(self._numbers))

    def view(self, index: int, params: list[torch.Tensor], offsets: list[int], numel: int) -> BucketView:
        return BucketView(index, params, offsets, numel, tuple(self.key(p) for p in params))

    # ---- one bucket ------------------------------------------------------------------------------
    def prepare(self, flat: torch.Tensor, view: BucketView, lane: str = "backward", undoable: bool = False) -> Pending:
        """A full bucket's step begins: counted for the dense-first steps, and started and encoded here when its
        codec encodes in backward (the next layer's backward waits, as DLGS's timing model has it). `undoable`: the
        step may not be taken though it completes (a round that does not commit): `undo` can put the codec back."""
        dense = self.dense_first is not None and self.dense_first.dense(view.keys)
        pending = Pending(flat, view, DENSE if dense else self.codec,
                          undoable=undoable or self.loss_scale is not None)
        if pending.codec.encode_in_backward:
            if self.norms is not None:
                self.norms.add(LOCAL, flat)
            start = now_us()
            pending.exchange = self._start(pending)
            for i in range(pending.exchange.pieces):
                pending.exchange.encode(Piece(i))
            pending.encoded = True
            end = now_us()
            pending.times.encode_s = (end - start) / 1e6
            self.tracer.add("encode", start, end, lane, bucket=view.index)
        return pending

    def complete(self, pending: Pending) -> Times:
        """Start (unless prepared), pipeline the pieces, finish: the mean over ranks is in the bucket after."""
        begin = now_us()
        times, view = pending.times, pending.view
        if pending.exchange is None:
            if self.norms is not None:
                self.norms.add(LOCAL, pending.flat)
            pending.exchange = self._timed("encode", pending, lambda: self._start(pending))
        jobs = (self._piece(pending, Piece(i, 1 + i % TAGS, i % self.depth)) for i in range(pending.exchange.pieces))
        times.bytes_sent = run_pipelined(jobs, self.depth)
        self._timed("decode", pending, pending.exchange.finish)
        if pending.scale is not None:
            pending.flat.mul_(pending.scale)
        if pending.saved is not None and pending.flat.numel() and not torch.isfinite(pending.flat[:1]).all():
            self.undo(pending)  # a codec's NaN fills the bucket: the step is skipped
        if pending.codec is DENSE and self.codec is not DENSE:
            scaled = self.loss_scale is not None and self.codec.keeps_gradients
            self.codec.after_dense(pending.flat / self.loss_scale() if scaled else pending.flat, view)
        if self.norms is not None:
            self.norms.add(MEAN, pending.flat)
        times.wire_s = max((now_us() - begin) / 1e6 - times.codec_s, 0.0)
        return times

    def undo(self, pending: Pending) -> None:
        """Put the codec's state back as the bucket's step found it: the one undo path, for a step fp16's scaler
        skips and for a round that does not commit."""
        pending.codec.restore_bucket(pending.view, pending.saved[0])

    def replace_codec(self, codec: Codec) -> None:
        """Take `codec` (its state as a round found it) and new scratch: an exchange abandoned mid-way may still
        write into the ones it holds."""
        self.codec, self._scratch = codec, {}

    def exchange(self, flat: torch.Tensor, view: BucketView) -> int:
        """Replace `flat` by the mean over ranks, prepared and completed on this thread; the bytes sent."""
        return self.complete(self.prepare(flat, view, lane="comm")).bytes_sent

    def __getstate__(self) -> dict:
        """The codec and the policies travel; the channel, tracer, scratch and parameter numbers are this
        process's (bind again after unpickling)."""
        return {"codec": self.codec, "depth": self.depth, "dense_first": self.dense_first, "norms": self.norms}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, channel=None, tracer=Tracer(False), loss_scale=None, _numbers={}, _scratch={})

    # ---- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The codec's state, with the dense-first counts beside it where there are dense-first steps."""
        return self._with_counts(self.codec.state_dict())

    def shared_state_dict(self) -> dict | None:
        """The codec's state every rank holds alike (`Codec.shared_state_dict`), with the dense-first counts."""
        return self._with_counts(self.codec.shared_state_dict())

    def _with_counts(self, state: dict | None) -> dict | None:
        return self.dense_first.wrap(state) if state is not None and self.dense_first is not None else state

    def load_state_dict(self, state: dict) -> None:
        self.codec.load_state_dict(self.dense_first.unwrap(state) if self.dense_first is not None else state)

    # ---- the pieces ------------------------------------------------------------------------------
    def _start(self, pending: Pending) -> Exchange:
        if self.loss_scale is not None and pending.codec.keeps_gradients:
            pending.scale = self.loss_scale()
            pending.flat.div_(pending.scale)
        if pending.undoable:  # a step that may not be taken: the contract's one undo path
            pending.saved = (pending.codec.save_bucket(pending.view, pending.flat),)
        scratch = self._scratch.setdefault(pending.view.index, Scratch())
        return pending.codec.start(pending.flat, pending.view, self.channel, scratch)

    def _piece(self, pending: Pending, piece: Piece) -> Steps:
        """One piece as steps, through the contract's one piece loop, each part timed and traced."""
        def waited(posted: int) -> None:
            self.tracer.add("wire", posted, now_us(), f"wire {piece.slot}", bucket=pending.view.index,
                            piece=piece.index)

        return piece_steps(pending.exchange, piece, encode=not pending.encoded,
                           timed=lambda name, work, part: self._timed(name, pending, work, part), waited=waited)

    def _timed(self, name: str, pending: Pending, work, piece: Piece | None = None):
        """Run `work()` as a span `name` of the communication thread, counted as codec time; its result."""
        start = now_us()
        result = work()
        end = now_us()
        pending.times.codec_s += (end - start) / 1e6
        self.tracer.add(name, start, end, "comm", bucket=pending.view.index,
                        **({"piece": piece.index} if piece is not None else {}))
        return result


def offsets_of(params: list[torch.Tensor]) -> list[int]:
    """Where each of `params` starts in a flat buffer that holds them one after another."""
    return list(itertools.accumulate((p.numel() for p in params[:-1]), initial=0))


def open_channel(codec: Codec, group, topology=None, algorithm: str = "ring", scatter: bool = False) -> Channel:
    """Where `codec`'s buckets travel in `group`: with the node and cross-node groups `topology` where given, else,
    where the codec or the allreduce sums in two stages, the running job's (built now: collective on first use)."""
    if topology is None and (needs_topology(codec) or ALGORITHMS[algorithm].needs_topology):
        topology = Topology.from_env().groups()
    return Channel(group, dist.get_world_size(group), algorithm, topology, scatter=scatter)
