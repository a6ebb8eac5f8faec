"""Checkpoints: written atomically at every epoch's end, read back with weights_only=True, and resumed exactly."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scalesgd.comm.exchange import GradientExchange
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.runtime.process_group import DistEnv
from scalesgd.train.rundir import CHECKPOINT_NAME

REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "rng", "config")


@dataclass(frozen=True)
class Progress:
    """Where a run stands after an epoch: that epoch, the best test accuracy so far, seconds trained in all."""

    epoch: int = 0
    best_test_acc: float = 0.0
    elapsed_s: float = 0.0


def save(run_dir: Path, cfg: TrainConfig, model: nn.Module, exchange: GradientExchange, scheduler,
         progress: Progress, env: DistEnv) -> None:
    """Gather every rank's RNG and codec state; rank 0 writes the checkpoint (collective: every rank calls it)."""
    rng_states = _gather(env, torch.get_rng_state())  # data augmentation draws from it
    state = exchange.state_dict()
    codec_states = _gather_objects(env, state["codec"]) if exchange.codec is not None else []  # residuals differ
    if env.is_main:
        save_atomic({"model": model.state_dict(), "optimizer": state["optimizer"], "scheduler": scheduler.state_dict(),
                     "epoch": progress.epoch, "rng": {"torch": rng_states}, "config": cfg.to_dict(),
                     "best_test_acc": progress.best_test_acc, "elapsed_s": progress.elapsed_s,
                     "codec_states": codec_states}, Path(run_dir) / CHECKPOINT_NAME)


def restore(run_dir: Path, model: nn.Module, exchange: GradientExchange, scheduler, env: DistEnv) -> Progress:
    """Put this rank back where the last checkpoint left it (its own codec state and RNG); where it stood."""
    state = load(Path(run_dir) / CHECKPOINT_NAME)
    model.load_state_dict(state["model"])
    codec_states = state.get("codec_states") or []
    exchange.load_state_dict({"optimizer": state["optimizer"],
                              "codec": codec_states[env.rank] if codec_states else None})
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"][env.rank])
    return Progress(state["epoch"], state["best_test_acc"], state["elapsed_s"])


def resume_config(run_dir: Path, given: dict) -> TrainConfig:
    """The stored configuration of `run_dir`, with the runtime options in `given`; UsageError on any other change."""
    state = load(Path(run_dir) / CHECKPOINT_NAME)
    try:
        stored = TrainConfig.from_dict(state["config"])
    except (TypeError, UsageError) as err:
        raise UsageError(f"`resume` {run_dir}: its stored configuration is not usable ({err})") from None
    wanted = TrainConfig.from_dict({**stored.to_dict(), **given})
    conflicts = wanted.incompatible_with(stored)
    if conflicts:
        name = conflicts[0]
        raise UsageError(f"`resume` {run_dir}: `{name}` {getattr(wanted, name)!r} differs from the run's "
                         f"{getattr(stored, name)!r}; a resumed run keeps its own configuration")
    if state["epoch"] >= stored.epochs:
        raise UsageError(f"`resume` {run_dir}: the run already finished all {stored.epochs} epochs")
    wanted.run_dir = str(run_dir)
    return wanted


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
        raise UsageError(f"no checkpoint at {path}; `resume` takes a run directory that has finished "
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


def _gather(env: DistEnv, tensor: torch.Tensor) -> list[torch.Tensor]:
    everyone = [torch.empty_like(tensor) for _ in range(env.world_size)]
    dist.all_gather(everyone, tensor)
    return everyone


def _gather_objects(env: DistEnv, obj) -> list:
    everyone: list = [None] * env.world_size
    dist.all_gather_object(everyone, obj)
    return everyone
