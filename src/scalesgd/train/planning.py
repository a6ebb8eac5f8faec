"""`--planner dlgs|optimal`: profile the model on this process group, plan on rank 0, share the plan; show it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.table import Table

from scalesgd import output
from scalesgd.comm.buckets import BucketPlan, model_tensors, plan_from_groups
from scalesgd.comm.planner import PLANNERS
from scalesgd.comm.timing import iteration_time
from scalesgd.comm.profile import Profile, profile_model
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.runtime.process_group import DistEnv, broadcast_object
from scalesgd.train.rundir import PROFILE_NAME, write_json


def plan_exchange(cfg: TrainConfig, model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], loss_fn,
                  env: DistEnv, run_dir: Path | None = None, resume: bool = False) -> tuple[BucketPlan, dict]:
    """The planner's bucket plan for this run and what it predicts (collective: every rank calls it).

    Every rank takes part in the measurement (the message cost is measured on the real group);
    rank 0's profile decides, and its plan is broadcast so every rank buckets alike. A resumed run
    keeps the plan it started with (its residuals belong to those groups). With a run directory the
    profile and plan are saved there.
    """
    saved = run_dir / PROFILE_NAME if run_dir is not None else None
    if resume and saved is not None and saved.exists():
        decided = json.loads(saved.read_text())
        plan = plan_from_groups(decided["groups"], model_tensors(model), f"planner:{cfg.planner}")
        return plan, summary_of(decided)
    profile = profile_model(model, batch, loss_fn, cfg.density, cfg.topk_reuse, group=env.exchange_group)
    decided = None
    if env.is_main:
        groups = PLANNERS[cfg.planner](profile.t_f, profile.t_b, profile.sizes, profile.comm_time,
                                       profile.sparsify_time)
        backward = list(range(len(profile.sizes) - 1, -1, -1))
        decided = {"groups": groups, "profile": profile.to_dict(),
                   "predicted_iteration_s": predicted(profile, groups),
                   "predicted_unmerged_s": predicted(profile, [[i] for i in backward]),
                   "predicted_single_group_s": predicted(profile, [backward])}
        if saved is not None:
            write_json(saved, decided)
    decided = broadcast_object(decided)
    plan = plan_from_groups(decided["groups"], model_tensors(model), f"planner:{cfg.planner}")
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


def show_profile(run_dir: Path) -> None:
    """`scalesgd profile RUN_DIR`: the saved profile, the fitted models, the groups and the predictions."""
    path = Path(run_dir) / PROFILE_NAME
    if not path.is_file():
        raise UsageError(f"no {PROFILE_NAME} in {run_dir}; it is written by `scalesgd train --planner dlgs|optimal`")
    try:
        table, lines = profile_view(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, LookupError, TypeError, ArithmeticError, RecursionError) as err:
        raise UsageError(f"{path} is not a profile ({_reason(err)}); profiles are written by `scalesgd train "
                         "--planner dlgs|optimal`") from None
    console = output.console()
    console.print(table)
    for line in lines:
        console.print(line, highlight=False)


def _reason(err: Exception) -> str:
    """What reading a file that is not a profile raised, in one line."""
    if isinstance(err, KeyError):
        return f"no entry {err}"
    return (str(err).splitlines() or [type(err).__name__])[0]


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
