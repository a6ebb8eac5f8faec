"""The codec contract: one bucket's exchange, described as steps that the engine runs.

For each bucket and step the engine calls `codec.start(flat, bucket, channel, scratch)` and gets an `Exchange`:
the bucket's transfer cut into pieces. For every piece it calls `encode(piece)` (this rank's bytes of the piece),
runs `transfer(piece)` (a collective written as steps: each posts sends and receives, the arithmetic between them
is the reduction) and `decode(piece)` (the mean over ranks into the bucket); after the last piece, `finish()`.
The engine keeps several pieces in flight, so one piece's arithmetic runs while others' bytes are on the wire,
and it times every part, so the trace's encode, wire, reduce and decode spans mean the same for every codec.

State: what a codec keeps per parameter (fp8's ranges, top-k's residuals) lives in the codec, keyed by the
parameter numbers the engine gives in `BucketView.keys`; a bucket's buffers kept across steps (the wire bytes,
a sum's scratch, cached scales) live with the engine's bucket, in the `Scratch` it passes; what one step of one
bucket needs between the calls lives in its `Exchange`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scalesgd.comm.wire.collectives import allreduce, allreduce_steps
from scalesgd.comm.wire.pipeline import PIECE_BYTES, Steps


@dataclass
class Channel:
    """Where a bucket travels: the process group, its size, the allreduce algorithm, the node groups, and the bytes
    on the wire of the pieces the engine pipelines."""

    group: object
    world_size: int
    algorithm: str = "ring"
    topology: object | None = None
    piece_bytes: int = PIECE_BYTES

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
    needs_topology = False  # True: the transfer runs in the node / cross-node groups of `Channel.topology`
    encode_in_backward = False  # True: `start` and every `encode` run on autograd's thread (no collective there)
    keeps_gradients = False  # True: it carries gradients across steps (residuals, a momentum): fp16's loss scale,
    #                          which changes between steps, is divided out of what it is given and put back after

    @abstractmethod
    def start(self, flat: torch.Tensor, bucket: BucketView, channel: Channel, scratch: Scratch) -> Exchange:
        """This step's exchange of `flat` (the bucket's gradients, where the mean is written back)."""

    def after_dense(self, out: torch.Tensor, bucket: BucketView) -> None:
        """Called with the mean of a step exchanged dense instead of by this codec (the engine's dense-first steps)."""

    def save_bucket(self, bucket: BucketView):
        """What `restore_bucket` needs to undo the coming step of this bucket: a codec whose state a step changes
        before it knows the sum is finite (top-k's residuals) keeps a copy; None where there is nothing to undo."""
        return None

    def restore_bucket(self, bucket: BucketView, saved) -> None:
        """Undo a step whose sum was not finite (an fp16 overflow somewhere: the step is skipped everywhere)."""

    def counters(self) -> dict[str, float]:
        """This rank's guardrail counters since the last call (fractions, one value per step); {} when none."""
        return {}

    def pop_notices(self) -> list[tuple[torch.Tensor, str]]:
        """What the codec changed on its own since the last call, e.g. a tensor now sent dense: (parameter, text)."""
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"codec {self.name} keeps no state, got keys {sorted(state)}")
