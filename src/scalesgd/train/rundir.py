"""A run directory and the files in it: config.json, the checkpoint, metrics, summary, report and profile."""

from __future__ import annotations

import errno
import json
import shutil
import time
from pathlib import Path

from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.output import write_json

CONFIG_NAME = "config.json"
CHECKPOINT_NAME = "checkpoint.pt"
PREVIOUS_CHECKPOINT_NAME = "checkpoint.prev.pt"  # the one before: used when the latest cannot be read
METRICS_NAME = "metrics.jsonl"
SUMMARY_NAME = "summary.json"
REPORT_NAME = "report.png"
BUCKETS_NAME = "buckets.json"
FULL = (errno.ENOSPC, errno.EDQUOT)  # the disk (or the user's quota) is full


def default_run_dir() -> Path:
    """runs/<timestamp>, unique even when two runs start in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path("runs") / stamp
    n = 1
    while path.exists():
        n += 1
        path = Path("runs") / f"{stamp}-{n}"
    return path


def prepare_new_run(cfg: TrainConfig) -> Path:
    """Create the run directory for a fresh run; refuse to write over an existing run."""
    run_dir = Path(cfg.output.run_dir) if cfg.output.run_dir else default_run_dir()
    if run_dir.exists() and any(run_dir.iterdir()):
        if (run_dir / CHECKPOINT_NAME).exists():
            raise UsageError(f"`run_dir` {run_dir} already holds a run; choose a new directory or continue it "
                             f"with `resume` {run_dir}")
        raise UsageError(f"`run_dir` {run_dir} already holds files but no checkpoint (a run that stopped before "
                         "its first epoch ended has nothing to resume); remove it or choose a new directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.output.run_dir = str(run_dir)
    write_config(cfg, run_dir)
    return run_dir


def write_config(cfg: TrainConfig, run_dir: Path) -> None:
    """config.json, whole or not at all: a full disk leaves the one before as it was, and says so in one line."""
    path = Path(run_dir) / CONFIG_NAME
    try:
        write_json(path, cfg.to_dict())
    except OSError as err:
        if not disk_full(err):
            raise
        raise UsageError(f"no space left writing {path}; free some and run the command again") from None


def disk_full(err: BaseException | None) -> bool:
    """Whether an error, or one it arose from, is a full disk (torch's checkpoint writer reports one as its own
    RuntimeError, "unexpected pos …", raised while handling the OSError)."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in FULL:
            return True
        err = err.__cause__ or err.__context__
    return False


def discard_failed_start(run_dir: Path, made: bool) -> None:
    """Remove what a new run wrote when it failed before its first checkpoint and before logging a step (config.json,
    an empty log, a plan), so the same command is not refused afterwards; `made`: the directory too. A run that
    logged steps keeps them to be looked into."""
    run_dir = Path(run_dir)
    checkpoints = (run_dir / CHECKPOINT_NAME, run_dir / PREVIOUS_CHECKPOINT_NAME)
    if not run_dir.is_dir() or any(p.exists() for p in checkpoints) or logged(run_dir / METRICS_NAME):
        return
    for entry in run_dir.iterdir():  # the directory was empty when this run began: all of it is the run's
        if entry.is_file() or entry.is_symlink():
            entry.unlink()
    if made and not any(run_dir.iterdir()):
        run_dir.rmdir()


def logged(metrics: Path) -> bool:
    """Whether a metrics log holds anything."""
    try:
        return bool(metrics.read_bytes().strip())
    except FileNotFoundError:
        return False


def read_config(run_dir: Path) -> TrainConfig:
    return TrainConfig.from_dict(json.loads((Path(run_dir) / CONFIG_NAME).read_text(encoding="utf-8")))


def prune(run_dir: Path, prefix: str, keep: set[str | None]) -> None:
    """Remove the checkpoint folders (`prefix`: shards, rank states) no checkpoint file names any longer (rank 0,
    after the file is in place)."""
    for folder in Path(run_dir).glob(f"{prefix}*"):
        if folder.is_dir() and folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)
