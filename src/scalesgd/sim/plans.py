"""`scalesgd plan` and `scalesgd profile`: what the engine and the planner would do with a model, or did in a run,
printed: the bucket plan of a model, and the timing profile and groups a `--planner` run measured and chose."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scalesgd import checks, output
from scalesgd.comm.cost.planner import PROFILE_NAME, profile_view
from scalesgd.comm.engine.buckets import model_tensors, plan_buckets, spec_problem
from scalesgd.errors import UsageError
from scalesgd.models import MODELS, build_model
from scalesgd.options import Options, option


@dataclass
class PlanCommand(Options):
    """`scalesgd plan`: which gradients of a model travel together, first exchanged first."""

    model: str = option("resnet50", "the network whose gradients are planned", choices=MODELS)
    buckets: str = option("size:1", "size:MB | growing[:FIRST_MB[:FACTOR]] | layer | single: how gradients are "
                          "grouped into messages", check=spec_problem)
    classes: int = option(1000, "classifier outputs", check=checks.positive)
    in_channels: int = option(3, "input channels", check=checks.positive)


def show_plan(cfg: PlanCommand, argv: list[str]) -> int:
    """The bucket plan of the model, as the engine would build it."""
    model = build_model(cfg.model, cfg.classes, cfg.in_channels)
    output.console().print(plan_buckets(cfg.buckets, model_tensors(model)).table())
    return 0


@dataclass
class ProfileCommand(Options):
    """`scalesgd profile`: what a `--planner` run measured and the groups it chose."""

    run_dir: str = option("", "a run directory of a --planner run", positional="1")


def show_profile(cfg: ProfileCommand, argv: list[str] | None = None) -> int:
    """`scalesgd profile RUN_DIR`: the saved profile, the fitted models, the groups and the predictions."""
    run_dir = Path(cfg.run_dir)
    path = run_dir / PROFILE_NAME
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
    return 0


def _reason(err: Exception) -> str:
    """What reading a file that is not a profile raised, in one line."""
    if isinstance(err, KeyError):
        return f"no entry {err}"
    return (str(err).splitlines() or [type(err).__name__])[0]
