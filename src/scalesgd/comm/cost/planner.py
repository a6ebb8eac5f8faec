"""The planner: which layers travel together. DLGS's greedy merge (Ju et al.) and the exact optimum under the
timing model of `scalesgd.comm.cost.timing`, and `--planner dlgs|optimal` in a training run: profile the model on
the run's process group, plan on rank 0, share the plan, save it, and show it (`scalesgd profile RUN_DIR`).

A group is sparsified (or encoded) and sent as one message: its backward time and size are the sums
of its layers', its sparsification and communication times are functions of that size.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from rich.table import Table

from scalesgd import output
from scalesgd.comm.cost.profile import Profile, profile_model
from scalesgd.comm.cost.timing import TimeOfSize, iteration_time
from scalesgd.comm.engine.buckets import BucketPlan, Grouping, model_tensors, plan_from_groups
from scalesgd.comm.wire.collectives import broadcast_object
from scalesgd.registry import Registry

PROFILE_NAME = "profile.json"  # in a run directory: the profile and the groups a planned run uses


def plan_dlgs(t_f: float, t_b: Sequence[float], sizes: Sequence[int], comm_time: TimeOfSize,
              sparsify_time: TimeOfSize) -> Grouping:
    """Ju et al. 2024 (DLGS)'s Algorithm 2: scan from the last layer; merge the current group into the next layer
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
NO_PLANNER = "none"  # the buckets come from --buckets (or a codec's own rule), not from a planner


def plan_exchange(planner: str, density: float, reuse: int, model: torch.nn.Module,
                  batch: tuple[torch.Tensor, torch.Tensor], loss_fn, group=None, run_dir: Path | None = None,
                  resume: bool = False, wire: str = "compact") -> tuple[BucketPlan, dict]:
    """The planner's bucket plan for this run and what it predicts (collective: every rank calls it).

    Every rank takes part in the measurement (the message cost is measured on the real group);
    rank 0's profile decides, and its plan is broadcast so every rank buckets alike. A resumed run
    keeps the plan it started with (its residuals belong to those groups). With a run directory the
    profile and plan are saved there.
    """
    saved = run_dir / PROFILE_NAME if run_dir is not None else None
    if resume and saved is not None and saved.exists():
        decided = json.loads(saved.read_text())
        plan = plan_from_groups(decided["groups"], model_tensors(model), f"planner:{planner}")
        return plan, summary_of(decided)
    profile = profile_model(model, batch, loss_fn, density, reuse, group=group, wire=wire)
    decided = None
    if dist.get_rank() == 0:
        groups = PLANNERS[planner](profile.t_f, profile.t_b, profile.sizes, profile.comm_time, profile.sparsify_time)
        backward = list(range(len(profile.sizes) - 1, -1, -1))
        decided = {"groups": groups, "profile": profile.to_dict(),
                   "predicted_iteration_s": predicted(profile, groups),
                   "predicted_unmerged_s": predicted(profile, [[i] for i in backward]),
                   "predicted_single_group_s": predicted(profile, [backward])}
        if saved is not None:
            output.write_json(saved, decided)
    decided = broadcast_object(decided)
    plan = plan_from_groups(decided["groups"], model_tensors(model), f"planner:{planner}")
    return plan, summary_of(decided)


def summary_of(decided: dict) -> dict:
    """The predictions and the measured model parameters they came from, for summaries and tables."""
    prof = decided["profile"]
    return {k: v for k, v in decided.items() if k.endswith("_s")} | {
        "groups": len(decided["groups"]), "forward_s": prof["t_f"], "backward_s": sum(prof["t_b"]),
        "message_alpha_s": prof["comm"][0], "message_beta_s_per_element": prof["comm"][1],
        "selection_a_s": prof["sparsify"][0], "selection_b_s_per_element": prof["sparsify"][1]}


def predicted(profile: Profile, groups: list[list[int]]) -> float:
    """The timing model's iteration time for `groups` under `profile`."""
    return iteration_time(groups, profile.t_f, profile.t_b, profile.sizes, profile.comm_time, profile.sparsify_time)


def profile_view(saved: dict) -> tuple[Table, list[str]]:
    """A saved profile's table and summary lines, made in full first so that a file that is not a profile fails
    before anything is printed."""
    prof = saved["profile"]
    group_of = {layer: g for g, group in enumerate(saved["groups"]) for layer in group}
    table = Table(title=f"profile: forward {1e3 * prof['t_f']:.2f} ms, {prof['world_size']} ranks, "
                        f"density {prof['density']:g}, threshold reused {prof['reuse']} steps")
    for column in ("layer", "tensor", "elements", "backward ms", "group"):
        table.add_column(column, justify="left" if column == "tensor" else "right")
    for i in range(len(prof["sizes"]) - 1, -1, -1):
        table.add_row(str(i), str(prof["names"][i]), f"{prof['sizes'][i]:,}", f"{1e3 * prof['t_b'][i]:.3f}",
                      str(group_of[i]))
    (alpha, beta), (a, b) = prof["comm"], prof["sparsify"]
    return table, [f"message of d elements: {1e3 * alpha:.3f} ms + {1e9 * beta:.3f} ns·d; "
                   f"selection: {1e3 * a:.3f} ms + {1e9 * b:.3f} ns·d",
                   f"{len(saved['groups'])} groups; predicted iteration {1e3 * saved['predicted_iteration_s']:.1f} ms "
                   f"(unmerged {1e3 * saved['predicted_unmerged_s']:.1f} ms, one group "
                   f"{1e3 * saved['predicted_single_group_s']:.1f} ms)"]
