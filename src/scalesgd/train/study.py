"""One `scalesgd train` run per point of a study, skipped when finished and resumed when cut short."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from scalesgd.errors import EXIT_USAGE, UsageError, error_line
from scalesgd.options import parse
from scalesgd.train.command import TrainCommand
from scalesgd.train.command import run as run_train
from scalesgd.train.rundir import CHECKPOINT_NAME, SUMMARY_NAME


def train_once(train_argv: list[str], run_dir: Path, label: str) -> int:
    """Run `scalesgd train TRAIN_ARGV` into `run_dir` unless its summary exists; resume a run that was cut short.
    The run's workers are started from this process, as `scalesgd train` starts them (no second interpreter to
    import torch again for every point)."""
    if (run_dir / SUMMARY_NAME).exists():
        return 0
    if (run_dir / CHECKPOINT_NAME).exists():
        argv = ["--resume", str(run_dir), "--quiet"]
    else:
        if run_dir.exists():  # started but never checkpointed: start again
            shutil.rmtree(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        argv = [*train_argv, "--run-dir", str(run_dir), "--quiet"]
    print(label, flush=True)
    try:
        command = TrainCommand.from_options(parse(TrainCommand, argv, "scalesgd train")).validate()
    except UsageError as err:
        print(error_line(err), file=sys.stderr)  # as the command line says it
        return EXIT_USAGE
    return run_train(command, argv)


def failed(label: str, code: int, run_dir: Path) -> int:
    """Say which point failed and where its files are; the exit status to return."""
    print(f"scalesgd: error: {label} failed (exit {code}); see {run_dir}", file=sys.stderr)
    return code


def slug(text: str) -> str:
    """A directory name for a list of train options."""
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in text.replace("--", "")).strip("_") or "default"
