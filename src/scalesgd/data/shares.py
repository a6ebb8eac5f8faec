"""Samples dealt to whoever is alive: the run's epochs cut into shares as if its configured workers all trained
(`GlobalBatchSampler`'s global batches, each in one share a worker), numbered across epochs; each round hands the
next members × H shares out, member r of W taking shares start + r, start + r + W, … So the data position is one
counter the members share (and a joiner heals with), the learning-rate schedule reads the global step a share
belongs to, and every sample of an epoch is trained on once whatever the membership — except the shares of a member
that dies before its round commits (skipped in that epoch: at most one round's) and, at the run's very end, the
fewer than W shares left over when W members cannot take a step each."""

from __future__ import annotations

from dataclasses import dataclass

from scalesgd.data.sampler import GlobalBatchSampler


@dataclass(frozen=True)
class Dealer:
    """The run's shares, from a sampler of its configured workers (its `world_size`: the shares of a step)."""

    sampler: GlobalBatchSampler
    epochs: int

    @property
    def slots(self) -> int:
        return self.sampler.world_size

    @property
    def per_epoch(self) -> int:
        return len(self.sampler) * self.slots

    @property
    def total(self) -> int:
        return self.per_epoch * self.epochs

    def indices(self, share: int) -> list[int]:
        """The training samples of `share`."""
        epoch, within = divmod(share, self.per_epoch)
        step, slot = divmod(within, self.slots)
        self.sampler.set_epoch(epoch + 1)  # the epochs the loop numbers from 1
        return self.sampler.share(step, slot)

    def global_step(self, share: int) -> int:
        """The run's step (from 0, across epochs) whose global batch `share` is part of: the schedule's position."""
        return share // self.slots

    def epoch_of(self, share: int) -> int:
        """The epoch (from 1) `share` is part of."""
        return share // self.per_epoch + 1

    def round_steps(self, start: int, members: int, local_steps: int) -> int:
        """The inner steps every member takes in the round starting at share `start`: H, fewer at the run's end."""
        return max(0, min(local_steps, (self.total - start) // members))


def round_shares(start: int, members: int, rank: int, steps: int) -> range:
    """Member `rank`'s shares of a round of `members` starting at share `start`, one an inner step."""
    return range(start + rank, start + steps * members, members)
