"""The codec contract: one bucket's exchange, described as steps that the engine runs.

For each bucket and step the engine calls `codec.start(flat, bucket, channel, scratch)` and gets an `Exchange`:
the bucket's transfer cut into pieces. For every piece it calls `encode(piece)` (this rank's bytes of the piece),
runs `transfer(piece)` (a collective written as steps: each posts sends and receives, the arithmetic between them
is the reduction) and `decode(piece)` (the mean over ranks into the bucket); after the last piece, `finish()`.
`piece_steps` is that loop, the one every exchange runs through: the engine's (pipelined, timed and traced) and an
exchange nested in another's transfer (lowrank's factors on their wire). The engine keeps several pieces in flight,
so one piece's arithmetic runs while others' bytes are on the wire, and it times every part, so the trace's encode,
wire, reduce and decode spans mean the same for every codec.

The rules every codec keeps:
- **State by parameter.** What a codec keeps across steps belongs to parameters and is keyed by the numbers the
  engine gives in `BucketView.keys` (the model's order: the same in every run, whatever the buckets): fp8's ranges,
  top-k's residuals, 1-bit Adam's momentum, lowrank's errors and factors (`state.FlatState` keeps it flat in the
  bucket's layout). What belongs to a bucket as a whole (top-k's threshold, 1-bit Adam's server error) is keyed by
  the tuple of its parameters' keys, never by the bucket's index. A bucket's buffers kept across steps (the wire
  bytes, a sum's scratch, cached scales) live with the engine's bucket, in the `Scratch` it passes; what one step of
  one bucket needs between the calls lives in its `Exchange`.
- **One undo path.** A codec changes its state as its step goes; it never undoes a step itself. Where a step may be
  skipped (fp16's gradient scaler skips one whose sum is not finite anywhere), the engine calls
  `save_bucket(bucket, flat)` before the step and `restore_bucket(bucket, saved)` after it when the mean it wrote is
  not finite, so a skipped step leaves no trace. A codec that keeps state makes the whole bucket non-finite on every
  rank when any rank's gradient was not finite (the engine reads the bucket's first number); a plain sum leaves the
  NaN where it arose. Without a scaler no step is skipped: the optimizer steps with what came, and a run stops at its
  next loss read.
- **Its own objects only.** An exchange reads and writes its codec through the codec's public attributes and
  methods, never another object's private ones.
- **Facts in the registration.** What code outside the codecs needs to know of one (the engines it runs on, its
  bucket rule, whether it needs the node groups, what a mode's @AMOUNT and /WIRE set, the optimizer it needs, how
  the simulator costs it) is declared in its `registry.CodecEntry`, not branched on by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from scalesgd.comm.wire.collectives import allreduce, allreduce_steps
from scalesgd.comm.wire.pipeline import PIECE_BYTES, Steps
from scalesgd.trace import now_us


@dataclass
class Channel:
    """Where a bucket travels: the process group, its size, the allreduce algorithm, the node groups, and the bytes
    on the wire of the pieces the engine pipelines."""

    group: object
    world_size: int
    algorithm: str = "ring"
    topology: object | None = None
    piece_bytes: int = PIECE_BYTES
    # the sum ends in this rank's row of `world_size` equal rows of the bucket (a reduce-scatter: FSDP's gradients),
    # not in the whole bucket on every rank; the exchange is one piece
    scatter: bool = False

    def bounds(self, length: int, element_size: int, multiple: int = 1) -> list[tuple[int, int]]:
        """[a, b) of each piece of a wire of `length` elements of `element_size` bytes: `piece_bytes` long, rounded
        up to a multiple of `multiple` (so a sum that cuts a piece in that many parts pads none), the last one
        shorter; one empty piece for an empty wire."""
        step = max(-(-max(self.piece_bytes // element_size, 1) // multiple) * multiple, multiple)
        return [(a, min(a + step, length)) for a in range(0, length, step)] or [(0, 0)]

    def allreduce(self, tensor: torch.Tensor) -> int:
        """In-place sum over the group; returns the bytes this rank sent."""
        return allreduce(tensor, self.algorithm, group=self.group, topology=self.topology)

    def allreduce_steps(self, tensor: torch.Tensor, tag: int = 0) -> Steps:
        """`allreduce` as steps, its messages under `tag`."""
        return allreduce_steps(tensor, self.algorithm, self.group, self.topology, tag)


def own_row(channel: Channel, n: int) -> tuple[int, int]:
    """[a, b) of this rank's row of a bucket of `n` elements that a scattering channel sums (`Channel.scatter`)."""
    width = n // channel.world_size
    rank = dist.get_rank(channel.group)
    return rank * width, (rank + 1) * width


@dataclass
class BucketView:
    """What a codec may know about a bucket: its index, parameters, their offsets in the flat buffer and the
    numbers that key per-parameter state (the same in every run, whatever the buckets)."""

    index: int
    params: list[torch.Tensor]
    offsets: list[int] = field(default_factory=list)
    numel: int = 0
    keys: tuple[int, ...] = ()


@dataclass(frozen=True)
class Piece:
    """One piece of a bucket's exchange as the engine runs it: its place, the message tag its transfer uses and
    the scratch slot it may use, both distinct among the pieces in flight at once."""

    index: int
    tag: int = 0
    slot: int = 0


class Scratch:
    """A bucket's buffers, kept across steps by the engine: the same tensor comes back while its size, dtype and
    device stay, a new zeroed one when they change; `memo` keeps a derived value while its key is unchanged."""

    def __init__(self):
        self._tensors: dict[str, torch.Tensor] = {}
        self._memos: dict[str, tuple] = {}

    def tensor(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        kept = self._tensors.get(name)
        if kept is None or kept.numel() != numel or kept.dtype != dtype or kept.device != torch.device(device):
            kept = self._tensors[name] = torch.zeros(numel, dtype=dtype, device=device)
        return kept

    def slot(self, piece: Piece, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A buffer of the piece's slot: pieces in flight together never share one."""
        return self.tensor(f"{name}#{piece.slot}", numel, dtype, device)

    def memo(self, name: str, key, make: Callable[[], object]):
        kept = self._memos.get(name)
        if kept is None or kept[0] != key:
            kept = self._memos[name] = (key, make())
        return kept[1]


class Exchange(ABC):
    """One bucket's exchange for one step, as its codec cut it: the engine encodes, transfers and decodes each
    piece, pieces overlapping, then calls `finish`."""

    bounds: list[tuple[int, int]]  # each piece's [a, b) on the wire

    @property
    def pieces(self) -> int:
        return len(self.bounds)

    def encode(self, piece: Piece) -> None:
        """Write this rank's bytes of the piece (nothing to do where `start` did all the encoding)."""

    @abstractmethod
    def transfer(self, piece: Piece) -> Steps:
        """The piece's collective as steps, returning the bytes this rank sent."""

    def decode(self, piece: Piece) -> None:
        """Write the piece's mean over ranks into the bucket (nothing to do where the sum left it there)."""

    def finish(self) -> None:
        """After the last piece: whatever needs the whole bucket (flags, guardrails)."""


class Codec(ABC):
    """How one bucket travels: `start` returns its `Exchange` for this step; the result written into the bucket is
    the mean over ranks.

    Subclasses keep per-parameter state across steps (residuals, ranges) and expose it through
    `state_dict`/`load_state_dict`, so a checkpoint restores it.
    """

    name = "codec"
    encode_in_backward = False  # True: `start` and every `encode` run on autograd's thread (no collective there)
    keeps_gradients = False  # True: it carries gradients across steps (residuals, a momentum): fp16's loss scale,
    #                          which changes between steps, is divided out of what it is given and put back after

    @abstractmethod
    def start(self, flat: torch.Tensor, bucket: BucketView, channel: Channel, scratch: Scratch) -> Exchange:
        """This step's exchange of `flat` (the bucket's gradients, where the mean is written back)."""

    def after_dense(self, out: torch.Tensor, bucket: BucketView) -> None:
        """Called with the mean of a step exchanged dense instead of by this codec (the engine's dense-first steps)."""

    def save_bucket(self, bucket: BucketView, flat: torch.Tensor):
        """What `restore_bucket` needs to undo the coming step of this bucket (`flat`: its gradients): a copy of the
        state the step may change, as the step finds it; None where there is nothing to undo."""
        return None

    def restore_bucket(self, bucket: BucketView, saved) -> None:
        """Undo the step `save_bucket` saved before: its sum was not finite somewhere, and the step is skipped."""

    def counters(self) -> dict[str, float]:
        """This rank's guardrail counters since the last call (fractions, one value per step); {} when none."""
        return {}

    def pop_notices(self) -> list[tuple[torch.Tensor, str]]:
        """What the codec changed on its own since the last call, e.g. a tensor now sent dense: (parameter, text)."""
        return []

    def state_dict(self) -> dict:
        return {}

    def shared_state_dict(self) -> dict | None:
        """What every rank holds alike, which a rank joining a running exchange starts from (its own residuals at
        zero); None where the state does not split so (it belongs to a fixed world)."""
        return None if self.keeps_gradients else self.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"codec {self.name} keeps no state, got keys {sorted(state)}")


def piece_steps(exchange: Exchange, piece: Piece, encode: bool = True, timed=None, waited=None) -> Steps:
    """One piece of an exchange as steps: encode it (unless `encode` is False: done already), its transfer's steps,
    decode it; returns the bytes it sent. `timed(name, work, piece)` runs each part of this rank's arithmetic (the
    engine times and traces them: encode, reduce, decode); `waited(posted_us)` is called after each wait on the
    wire."""
    run = timed or (lambda name, work, piece: work())
    if encode:
        run("encode", lambda: exchange.encode(piece), piece)
    transfer = _Stepper(exchange.transfer(piece))
    works = run("reduce", transfer.advance, piece)
    while works is not None:
        posted = now_us()
        yield works
        if waited is not None:
            waited(posted)
        works = run("reduce", transfer.advance, piece)
    run("decode", lambda: exchange.decode(piece), piece)
    return transfer.sent


def exchange_steps(exchange: Exchange, tag: int = 0) -> Steps:
    """A whole exchange as steps, its pieces one after another under `tag`, then `finish`: an exchange nested in
    another's transfer (lowrank's factors on their wire); returns the bytes sent."""
    sent = 0
    for i in range(exchange.pieces):
        sent += yield from piece_steps(exchange, Piece(i, tag, 0))
    exchange.finish()
    return sent


class _Stepper:
    """A transfer's steps advanced one at a time: the works each posts, then None and the bytes it returned."""

    def __init__(self, steps: Steps):
        self.steps, self.sent, self._started = steps, 0, False

    def advance(self) -> list | None:
        try:
            works = self.steps.send(None) if self._started else next(self.steps)
        except StopIteration as done:
            self.sent = done.value or 0
            return None
        self._started = True
        return works
