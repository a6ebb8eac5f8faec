"""Who is in a run: the one object the training loop, evaluation, checkpoints, the memory report and the periodic
exchange ask for their collectives and for whether a round commits, instead of reaching for the world group. A
change of membership (a worker dropped, one joining) is then a new `Membership`, not an edit in every caller.

    members = Membership.world()               # every rank of the default group, as it was at start-up
    members.all_reduce(sums)                   # the loop's, evaluation's, memory's collectives go through it
    if members.should_commit(): …              # a round's commit point (torchft's `Manager.should_commit`)

This one is fixed: it never shrinks, and every round it is asked about commits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Membership:
    """The ranks in the run's `group` (None: the default group) with its side groups: the gradient exchange's own
    (`exchange_group`) and the node and cross-node groups (`topology_groups`)."""

    group: object = None
    exchange_group: object = None
    topology_groups: object = None

    @classmethod
    def world(cls, exchange_group=None, topology_groups=None) -> Membership:
        """Every rank of the default process group."""
        return cls(None, exchange_group, topology_groups)

    # ---- who ---------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def is_main(self) -> bool:
        """Whether this rank writes what one rank writes (metrics, checkpoints, reports)."""
        return self.rank == 0

    # ---- a round's commit point ---------------------------------------------------------------------
    @property
    def may_abort(self) -> bool:
        """Whether a round may fail to commit (its codec's work must then be undoable): never, in a fixed group."""
        return False

    def should_commit(self) -> bool:
        """Whether the round just exchanged is taken by every member (a fixed group: always)."""
        return True

    # ---- the run's collectives ---------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        dist.all_reduce(tensor, op=op, group=self.group)
        return tensor

    def all_reduce_started(self, tensor: torch.Tensor):
        """`tensor` summed across the members once the returned work is waited for (only in a fixed group: an
        elastic one may be rebuilt before it lands)."""
        if self.may_abort:
            raise RuntimeError("an allreduce left in flight needs a fixed group; this one may change")
        return dist.all_reduce(tensor, group=self.group, async_op=True)

    def all_gather_object(self, obj) -> list:
        everyone: list = [None] * self.size
        dist.all_gather_object(everyone, obj, group=self.group)
        return everyone

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every member's `tensor` on the first member ([] elsewhere)."""
        everyone = [torch.empty_like(tensor) for _ in range(self.size)] if self.is_main else None
        dist.gather(tensor, everyone, group=self.group, group_dst=0)
        return everyone or []

    def gather_object(self, obj) -> list:
        """Every member's `obj` on the first member ([] elsewhere): nothing is sent back out, as an all-gather
        would (a periodic run's per-rank state is megabytes)."""
        everyone: list | None = [None] * self.size if self.is_main else None
        dist.gather_object(obj, everyone, group=self.group, group_dst=0)
        return everyone or []

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """The member `src`'s `tensor` on every member."""
        dist.broadcast(tensor, group=self.group, group_src=src)

    def barrier(self) -> None:
        dist.barrier(group=self.group)
