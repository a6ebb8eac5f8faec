"""Which layers travel together (SPEC §3): DLGS's greedy merge and the exact optimum, under `comm.timing`'s model.

A group is sparsified (or encoded) and sent as one message: its backward time and size are the sums
of its layers', its sparsification and communication times are functions of that size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scalesgd.comm.timing import Grouping, TimeOfSize, iteration_time
from scalesgd.registry import Registry


def plan_dlgs(t_f: float, t_b: Sequence[float], sizes: Sequence[int], comm_time: TimeOfSize,
              sparsify_time: TimeOfSize) -> Grouping:
    """The seed's Algorithm 2: scan from the last layer; merge the current group into the next layer
    when the model's t_iter (the layers not yet scanned left separate) drops, else start a new group."""
    layers = len(t_b)
    if layers == 0:
        return []
    done: Grouping = []
    current = [layers - 1]
    for layer in range(layers - 2, -1, -1):
        rest = [[i] for i in range(layer - 1, -1, -1)]
        merged = iteration_time(done + [current + [layer]] + rest, t_f, t_b, sizes, comm_time, sparsify_time)
        apart = iteration_time(done + [current, [layer]] + rest, t_f, t_b, sizes, comm_time, sparsify_time)
        if merged < apart:
            current.append(layer)
        else:
            done.append(current)
            current = [layer]
    return done + [current]


def plan_optimal(t_f: float, t_b: Sequence[float], sizes: Sequence[int], comm_time: TimeOfSize,
                 sparsify_time: TimeOfSize) -> Grouping:
    """The grouping with the least `iteration_time`, found exactly.

    Scanning in backward order, the model's state after a group is (total sparsification time so
    far, end of communication so far); both only delay what follows, so at each layer boundary only
    the Pareto-minimal states need keeping. Every contiguous next group is tried from each: O(L²·F)
    for F kept states (a handful in practice).
    """
    layers = len(t_b)
    if layers == 0:
        return []
    # backward_done[j]: t_f plus backward of layers L−1 … j (layers ≥ j are done)
    backward_done = [0.0] * (layers + 1)
    backward_done[layers] = t_f
    for j in range(layers - 1, -1, -1):
        backward_done[j] = backward_done[j + 1] + t_b[j]
    size_from = [0] * (layers + 1)  # size_from[j]: total size of layers ≥ j
    for j in range(layers - 1, -1, -1):
        size_from[j] = size_from[j + 1] + sizes[j]
    # fronts[i]: states with layers ≥ i grouped: (sparsify_total, comm_end, back-pointer)
    fronts: list[list[tuple[float, float, tuple | None]]] = [[] for _ in range(layers + 1)]
    fronts[layers] = [(0.0, 0.0, None)]
    for start in range(layers, 0, -1):  # the next group covers start−1 down to stop
        for spars, comm, back in fronts[start]:
            for stop in range(start - 1, -1, -1):
                size = size_from[stop] - size_from[start]
                spars_new = spars + sparsify_time(size)
                sparsified = backward_done[stop] + spars_new
                comm_new = max(sparsified, comm) + comm_time(size)
                fronts[stop].append((spars_new, comm_new, (start, stop, back)))
        for stop in range(start - 1, -1, -1):
            fronts[stop] = _pareto(fronts[stop])
    best = min(fronts[0], key=lambda state: state[1])
    groups: Grouping = []
    back = best[2]
    while back is not None:
        start, stop, back = back
        groups.append(list(range(start - 1, stop - 1, -1)))
    return groups[::-1]


def _pareto(states: list) -> list:
    """The states no other state beats in both sparsification total and communication end."""
    states.sort(key=lambda s: (s[0], s[1]))
    kept, best_comm = [], float("inf")
    for state in states:
        if state[1] < best_comm:
            kept.append(state)
            best_comm = state[1]
    return kept


# name → plan(t_f, t_b, sizes, comm_time, sparsify_time) → grouping
PLANNERS: Registry[Callable[..., Grouping]] = Registry("planner")
PLANNERS.add("dlgs", plan_dlgs)
PLANNERS.add("optimal", plan_optimal)
