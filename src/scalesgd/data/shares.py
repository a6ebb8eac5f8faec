"""Samples dealt to whoever is alive: the run's epochs cut into shares as if its configured workers all trained
(`GlobalBatchSampler`'s global batches, each in one share a worker), numbered across epochs; each round hands the
next shares out, one an inner step of each member (H each; fewer for a member that is slower than the others, as
`ElasticRounds.plan` says), step by step — with H for all, member r of W takes start + r, start + r + W, … — so
whoever is slow, every share is dealt once. The data position is one
counter the members share (and a joiner heals with), the learning-rate schedule reads the global step a share
belongs to, and every sample of an epoch is trained on once whatever the membership — except the shares of a member
that dies before its round commits (skipped in that epoch: at most one round's) and, at the run's very end, the
fewer than W shares left over when W members cannot take a step each. A member whose state is still crossing to it
is planned no steps, so dealt none."""

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

    def round_plan(self, start: int, plan: tuple[int, ...]) -> tuple[int, ...]:
        """The inner steps each member takes in the round starting at share `start`: `plan`'s, or at the run's end
        the same number for all planned any that the shares left allow (none: the run is over)."""
        if self.total - start >= sum(plan):
            return plan
        stepping = [bool(steps) for steps in plan] if any(plan) else [True] * len(plan)
        each = max(0, (self.total - start) // sum(stepping))
        return tuple(each if steps else 0 for steps in stepping)


def round_shares(start: int, plan: tuple[int, ...], rank: int) -> list[int]:
    """Member `rank`'s shares of a round starting at share `start` whose members take `plan`'s inner steps each (in
    rank order), one share a step: dealt step by step, member by member, to those still stepping — so with the same
    steps for all, member r of W takes start + r, start + r + W, …, and the round deals sum(plan) shares."""
    mine, share = [], start
    for step in range(max(plan)):
        for member, steps in enumerate(plan):
            if step < steps:
                if member == rank:
                    mine.append(share)
                share += 1
    return mine
