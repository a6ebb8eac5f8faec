"""Starting a training run: prepare (or reopen) its directory, then start its local workers."""

from __future__ import annotations

import json
from pathlib import Path

from scalesgd import launcher
from scalesgd.config import TrainConfig, default_run_dir, option_name
from scalesgd.errors import UsageError
from scalesgd.train import checkpoint

CONFIG_NAME = "config.json"


def prepare_new_run(cfg: TrainConfig) -> Path:
    """Create the run directory for a fresh run; refuse to write over an existing run."""
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir()
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"--run-dir {run_dir} already holds files; choose a new directory or continue it "
                         f"with --resume {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.run_dir = str(run_dir)
    write_config(cfg, run_dir)
    return run_dir


def write_config(cfg: TrainConfig, run_dir: Path) -> None:
    (run_dir / CONFIG_NAME).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n", encoding="utf-8")


def read_config(run_dir: Path) -> TrainConfig:
    return TrainConfig.from_dict(json.loads((run_dir / CONFIG_NAME).read_text(encoding="utf-8")))


def resume_config(run_dir: Path, given: dict) -> TrainConfig:
    """The stored configuration of `run_dir`, with runtime options from `given`; UsageError on a conflict."""
    state = checkpoint.load(run_dir / checkpoint.CHECKPOINT_NAME)
    try:
        stored = TrainConfig.from_dict(state["config"])
    except (TypeError, UsageError) as err:
        raise UsageError(f"--resume {run_dir}: its stored configuration is not usable ({err})") from None
    wanted = TrainConfig.from_dict({**stored.to_dict(), **given})
    conflicts = wanted.incompatible_with(stored)
    if conflicts:
        name = conflicts[0]
        raise UsageError(f"--resume {run_dir}: {option_name(name)} {getattr(wanted, name)!r} differs from the "
                         f"run's {getattr(stored, name)!r}; a resumed run keeps its own configuration")
    if state["epoch"] >= stored.epochs:
        raise UsageError(f"--resume {run_dir}: the run already finished all {stored.epochs} epochs")
    wanted.run_dir = str(run_dir)
    return wanted


def spawn_train(cfg: TrainConfig, run_dir: Path, resume: bool) -> int:
    """Train on `cfg.workers` local processes; the last checkpoint survives an interruption."""
    args = ["-m", "scalesgd.train.worker", str(run_dir)] + (["--resume"] if resume else [])
    return launcher.spawn(args, cfg.workers, cfg.master_addr, cfg.master_port, cfg.timeout)
