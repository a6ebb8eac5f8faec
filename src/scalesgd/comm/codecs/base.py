"""The codec interface: how one bucket of gradients is encoded, summed across ranks and decoded."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from scalesgd.comm.wire.collectives import allreduce


@dataclass
class Channel:
    """Where a bucket travels: the process group, its size, the allreduce algorithm and the node groups."""

    group: object
    world_size: int
    algorithm: str = "ring"
    topology: object | None = None

    def allreduce(self, tensor: torch.Tensor) -> int:
        """In-place sum over the group; returns the bytes this rank sent."""
        return allreduce(tensor, self.algorithm, group=self.group, topology=self.topology)


@dataclass
class BucketView:
    """What a codec may know about a bucket: its index, parameters and their offsets in the flat buffer."""

    index: int
    params: list[torch.Tensor]
    offsets: list[int] = field(default_factory=list)
    numel: int = 0


class Codec(ABC):
    """encode → communicate → decode for one bucket; the result written to `out` is the mean over ranks.

    Subclasses keep any state they need across iterations (residuals, ranges) and expose it through
    `state_dict`/`load_state_dict`, so a checkpoint restores it.
    """

    name = "codec"
    needs_topology = False  # True: `communicate` runs in the node / cross-node groups of `Channel.topology`
    encode_in_backward = False  # True: encode runs on autograd's thread (it must issue no collective)

    @abstractmethod
    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        """What travels for this bucket (may be `flat` itself, changed in place)."""

    def communicate(self, wire: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        """Sum `wire` across ranks in place (the default: one allreduce); returns bytes sent."""
        return channel.allreduce(wire)

    @abstractmethod
    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        """Write the mean over ranks, recovered from the summed `wire`, into `out`."""

    def exchange(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        """Replace `flat` by the mean over ranks: encode, communicate, decode; returns bytes sent."""
        wire = self.encode(flat, bucket, channel)
        sent = self.communicate(wire, bucket, channel)
        self.decode(wire, bucket, flat, channel)
        return sent

    def bind(self, params: list[torch.Tensor]) -> None:
        """Number the model's parameters in the model's order, so per-tensor state is keyed alike in every run
        whatever the buckets (DDP regroups them after its first iteration, and again after a resume)."""
        self.__dict__["_param_keys"] = {id(p): i for i, p in enumerate(params)}

    def key(self, param: torch.Tensor) -> int:
        """A parameter's number: its place in the bound model, else the order the codec first saw it."""
        keys = self.__dict__.setdefault("_param_keys", {})
        return keys.setdefault(id(param), len(keys))

    def __getstate__(self) -> dict:
        """Parameter numbers are by object identity, which a copy or another process does not share: `bind` again."""
        state = dict(self.__dict__)
        state.pop("_param_keys", None)
        return state

    def after_dense(self, out: torch.Tensor, bucket: BucketView) -> None:
        """Called with the mean of a step exchanged dense instead of by this codec (see `DenseFirst`)."""

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
