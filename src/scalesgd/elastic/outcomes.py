"""What a round and its members can come to: the quorum a round is taken by, the decision on it, and the ways a
member leaves the run (each one its own exception, so that a caller says which in one line)."""

from __future__ import annotations

from dataclasses import dataclass


class RefusedError(RuntimeError):
    """The running members' configuration is not this member's: it is left out of their rounds."""


class CoordinatorLost(RuntimeError):
    """The coordinator (the lighthouse and the store) cannot be reached: the run stops at this round boundary."""


class DivergedError(RuntimeError):
    """A round's members started it from different global states."""


class StateLost(RuntimeError):
    """Every member that held the run's global state left while it was crossing to this one: the run goes on from
    its last checkpoint, not from this member's part of it."""


class RunFinished(RuntimeError):
    """The run's last round committed without this member (a new one, or one left out of the last rounds): nothing
    is left for it to do."""


@dataclass(frozen=True)
class Quorum:
    """A round's members (their ids in rank order, and the rounds each had committed: `steps`), this member's rank,
    and whether the group was built anew for it (`changed`)."""

    key: str
    members: tuple[str, ...]
    steps: tuple[int, ...]
    rank: int
    changed: bool

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class Decision:
    """Whether a round commits, and the work behind it (the members' weights summed)."""

    commit: bool
    weight: int = 0
    digest: str = ""  # the global state every member started the round from
    paces: tuple[float, ...] = ()  # each member's seconds an inner step in the round, in rank order (0: unmeasured)
    late: int = 0  # of `weight`, the steps members back from a stop finished before it (their work counted late)
    last: bool = False  # the run's last round, cut short: its mean replaces the outer step
