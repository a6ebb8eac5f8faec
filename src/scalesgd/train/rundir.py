"""A run directory and the files in it: config.json, the checkpoint, metrics, summary, report and profile."""

from __future__ import annotations

import json
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
    write_json(Path(run_dir) / CONFIG_NAME, cfg.to_dict())


def read_config(run_dir: Path) -> TrainConfig:
    return TrainConfig.from_dict(json.loads((Path(run_dir) / CONFIG_NAME).read_text(encoding="utf-8")))
