"""The one timing model of an iteration (the recurrence of Ju et al. 2024, DLGS, for dense buckets as for sparse groups).

Layers are indexed 0 … L−1 in forward order; backward runs from L−1 down to 0. A grouping lists
groups in backward order, each a list of consecutive layer indices, e.g. `[[5, 4], [3], [2, 1, 0]]`.
A group becomes ready when backward has produced its last gradient and any work the codec does on
backward's own path (top-k selection) is done; one channel then exchanges the groups in order, and
the step waits for the last. The planner and the simulator both call `timeline`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scalesgd.comm.engine.buckets import check_grouping

TimeOfSize = Callable[[int], float]


@dataclass(frozen=True)
class Timeline:
    """When an iteration's parts end, from the start of its forward pass (seconds)."""

    end: float  # the last group's exchange is done: the step may start
    backward_end: float  # backward and the codec's work on its path are done
    busy: float  # the channel's total busy time
    overlapped: float  # the part of `busy` that ran while backward was still computing

    @property
    def exposed(self) -> float:
        """Exchange time nothing hid: the wait between the end of backward and the step."""
        return self.end - self.backward_end


def timeline(groups: Sequence[Sequence[int]], t_f: float, t_b: Sequence[float], sizes: Sequence[int],
             comm_time: TimeOfSize, inline_time: TimeOfSize) -> Timeline:
    """DLGS's recurrence for this grouping.

    Backward of a group starts when the previous group's inline work ends (τ_b), its inline work
    (sparsification) when its backward ends (τ_s); its exchange starts once it is ready and the
    previous group's exchange is done (τ_c), and takes `comm_time(size)` on the one channel.
    """
    check_grouping(groups, len(t_b))
    ready, comm_end, spans = t_f, 0.0, []
    for group in groups:
        size = sum(sizes[i] for i in group)
        ready = ready + sum(t_b[i] for i in group) + inline_time(size)
        start = max(ready, comm_end)
        comm_end = start + comm_time(size)
        spans.append((start, comm_end))
    backward_end = ready
    busy = sum(e - s for s, e in spans)
    overlapped = sum(max(0.0, min(e, backward_end) - min(s, backward_end)) for s, e in spans)
    return Timeline(max(comm_end, backward_end), backward_end, busy, overlapped)


def iteration_time(groups: Sequence[Sequence[int]], t_f: float, t_b: Sequence[float], sizes: Sequence[int],
                   comm_time: TimeOfSize, sparsify_time: TimeOfSize) -> float:
    """DLGS's t_iter for this grouping: the end of the last exchange."""
    return timeline(groups, t_f, t_b, sizes, comm_time, sparsify_time).end
