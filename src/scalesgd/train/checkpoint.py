"""Checkpoints written atomically and read back with weights_only=True."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from scalesgd.errors import UsageError

CHECKPOINT_NAME = "checkpoint.pt"
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "rng", "config")


def save_atomic(state: dict, path: Path) -> None:
    """Write `state` to a temporary file beside `path`, fsync it, then rename over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict:
    """Load a checkpoint safely (no arbitrary unpickling); UsageError if it is missing or not ours."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no checkpoint at {path}; --resume takes a run directory that has finished "
                         f"at least one epoch")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file is bad input here
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"{path} is not a readable scalesgd checkpoint ({first_line})") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise UsageError(f"{path} is not a scalesgd checkpoint: missing keys {missing}")
    return state
