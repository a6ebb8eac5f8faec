"""Checkpoints: written atomically at every epoch's end beside the one before, read back with weights_only=True (the
one before where the latest is unreadable), and resumed exactly."""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from scalesgd.comm.engine.exchange import GradientExchange
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError, as_flags
from scalesgd.options import flatten
from scalesgd.recipe.adascale import AdaScaleFactor
from scalesgd.runtime.process_group import DistEnv
from scalesgd.train import rank_states, rundir, shards
from scalesgd.train.rundir import CHECKPOINT_NAME, PREVIOUS_CHECKPOINT_NAME, disk_full

REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "rng", "config")


class NoSpace(RuntimeError):
    """The disk filled while a checkpoint was written: the write went to a temporary file, now removed, so the
    checkpoint before is whole."""


@dataclass(frozen=True)
class Progress:
    """Where a run stands: epochs finished, the best test accuracy so far, seconds trained in all; and, for a
    checkpoint taken mid-epoch, the steps done of the next epoch, their (loss, correct, samples) sums and seconds."""

    epoch: int = 0
    best_test_acc: float = 0.0
    elapsed_s: float = 0.0
    step: int = 0
    totals: tuple[float, float, float] = (0.0, 0.0, 0.0)
    epoch_s: float = 0.0
    noise: tuple[float, ...] = ()  # --noise-scale's smoothed estimates (`NoiseScale.state`)
    train_s: float | None = None  # the training clock (evaluations left out); None: not kept
    bytes_sent: int | None = None  # what this rank's exchange sent on that clock; None: not counted
    checkpoint_s: float = 0.0  # of that clock, the earlier checkpoints' seconds
    checkpoint_link_bytes: int | None = None  # what they put on rank 0's node's link; None: not measured

    @property
    def clock_s(self) -> float:
        """The training clock's reading here (an earlier version kept only the wall clock, which counts start-up,
        evaluations and checkpoints too)."""
        return self.train_s if self.train_s is not None else self.elapsed_s

    def iteration(self, steps_per_epoch: int) -> int:
        """The global iteration this progress stands at."""
        return self.epoch * steps_per_epoch + self.step


def save(run_dir: Path, cfg: TrainConfig, model: nn.Module, exchange: GradientExchange, scheduler,
         progress: Progress, env: DistEnv) -> None:
    """Gather every rank's RNG; each rank writes its own codec and replica state, rank 0 the checkpoint that names
    them (collective: every rank calls it)."""
    rng_states = env.members.gather(torch.get_rng_state())  # data augmentation draws from it
    state = exchange.state_dict()
    own = {"codec": state["codec"], "replica": state.get("replica")}  # residuals and local replicas differ per rank
    ranks = None
    if any(v is not None for v in own.values()):
        ranks = rank_states.folder_name(progress.epoch, progress.step)
        rank_states.save(own, Path(run_dir) / ranks, env, save_atomic)
    sharded = exchange.sharded_state(model)  # each rank's shards of the model and optimizer, where it keeps shards
    folder = None
    if sharded is not None:
        folder = shards.folder_name(progress.epoch, progress.step)
        shards.save(sharded, Path(run_dir) / folder, env)
    if env.is_main:
        save_atomic({"model": exchange.model_state(model) if sharded is None else None, "shards": folder,
                     "optimizer": state["optimizer"], "scheduler": scheduler.state_dict(),
                     "epoch": progress.epoch, "rng": {"torch": rng_states}, "config": cfg.to_dict(),
                     "best_test_acc": progress.best_test_acc, "elapsed_s": progress.elapsed_s,
                     "step": progress.step, "totals": list(progress.totals), "epoch_s": progress.epoch_s,
                     "noise": list(progress.noise), "scaler": state["scaler"],
                     "train_s": progress.train_s, "bytes_sent": progress.bytes_sent,
                     "checkpoint_s": progress.checkpoint_s, "checkpoint_link_bytes": progress.checkpoint_link_bytes,
                     "rank_states": ranks, "ranks": env.world_size}, Path(run_dir) / CHECKPOINT_NAME,
                    keep_previous=Path(run_dir) / PREVIOUS_CHECKPOINT_NAME)
        if folder is not None or ranks is not None:  # the previous checkpoint's folders stay: the fallback where
            before = _folders_named(Path(run_dir) / PREVIOUS_CHECKPOINT_NAME)  # this file is torn
            rundir.prune(run_dir, shards.PREFIX, {folder, before.get("shards")})
            rundir.prune(run_dir, rank_states.PREFIX, {ranks, before.get("rank_states")})


def _folders_named(path: Path) -> dict:
    """The folders a checkpoint file names (none where it is missing or unreadable), its tensors left unread: the
    file is mapped, not loaded (a periodic run's holds a replica's parameters and the model)."""
    try:
        state = torch.load(path, mmap=True, weights_only=True)
    except Exception:  # noqa: BLE001 (a missing or torn file names nothing worth keeping)
        return {}
    return {k: state.get(k) for k in ("shards", "rank_states")} if isinstance(state, dict) else {}


def restore(run_dir: Path, model: nn.Module, exchange: GradientExchange, scheduler, env: DistEnv) -> Progress:
    """Put this rank back where the last checkpoint left it (its own codec state and RNG); where it stood."""
    state = load_latest(run_dir)
    if state.get("shards"):
        exchange.load_sharded_state(model, Path(run_dir) / state["shards"])
    else:
        model.load_state_dict(state["model"])
    own = own_states(state, Path(run_dir), env)
    exchange.load_state_dict({"optimizer": state["optimizer"], "scaler": state.get("scaler"), **own})
    resume_schedule(scheduler, state["scheduler"])
    rng = state["rng"]["torch"]
    torch.set_rng_state(rng[env.rank % len(rng)])  # a new rank beyond the old ones draws as an old one did
    return Progress(state["epoch"], state["best_test_acc"], state["elapsed_s"], state.get("step", 0),
                    tuple(state.get("totals", (0.0, 0.0, 0.0))), state.get("epoch_s", 0.0),
                    tuple(state.get("noise", ())), state.get("train_s"), state.get("bytes_sent"),
                    state.get("checkpoint_s", 0.0), state.get("checkpoint_link_bytes"))


def own_states(state: dict, run_dir: Path, env: DistEnv) -> dict:
    """This rank's codec and replica state: its own file where the world is the one that wrote them, else the old
    ranks' averaged (`_mine`); from the checkpoint itself where an earlier version kept them there."""
    if not state.get("rank_states"):
        codec_states, replica_states = per_rank_states(state)
        return {"codec": _mine(codec_states, env), "replica": _mine(replica_states, env)}
    folder = run_dir / state["rank_states"]
    if state["ranks"] == env.world_size:
        return rank_states.load(folder, env.rank)
    everyone = [rank_states.load(folder, r) for r in range(state["ranks"])]
    return {k: _mine([s[k] for s in everyone] if everyone[0][k] is not None else [], env) for k in everyone[0]}


def per_rank_states(state: dict) -> tuple[list, list]:
    """The codec states and the replicas' own states (periodic synchronisation's) a checkpoint keeps per rank; an
    earlier version kept the replicas' in the codec's slot."""
    codec_states, replica_states = state.get("codec_states") or [], state.get("replica_states") or []
    if not replica_states and codec_states and isinstance(codec_states[0], dict) and "periodic" in codec_states[0]:
        return [], codec_states
    return codec_states, replica_states


def _mine(states: list, env: DistEnv):
    """This rank's of the old ranks' `states`; their average where the number of workers changed (what the old ranks
    still owed the mean, a residual or a replica's drift, is owed by the new ones alike)."""
    if not states:
        return None
    return states[env.rank] if len(states) == env.world_size else mean_state(states)


def resume_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, stored: dict) -> None:
    """The stored step (and AdaScale's gain and progress) with this run's schedule and peak rate: the stored ones, or
    as `resume` changed them (more epochs stretch the decay)."""
    # copies of this run's factors (loading writes the stored fields into the scheduler's own), one per object:
    # the param groups share one factor, and AdaScale's must advance once per step
    copies = {id(f): copy.copy(f) for f in scheduler.lr_lambdas}
    schedule, peaks = [copies[id(f)] for f in scheduler.lr_lambdas], list(scheduler.base_lrs)
    scheduler.load_state_dict(stored)
    for fresh, loaded in zip(schedule, scheduler.lr_lambdas):  # AdaScale's gain and progress are run state
        if hasattr(fresh, "resume_from"):
            fresh.resume_from(loaded)
    scheduler.lr_lambdas, scheduler.base_lrs = schedule, peaks
    for group, peak, factor in zip(scheduler.optimizer.param_groups, peaks, schedule):
        group["initial_lr"], group["lr"] = peak, peak * factor(scheduler.last_epoch)


def mean_state(states: list):
    """One codec state for every rank of a new group, from the old ranks' states: floating tensors (residuals,
    momenta) and floats averaged, so what the old ranks still owed the mean gradient is owed by the new ones
    (the mean of W' copies of the average is the old mean); anything else, rank 0's."""
    first = states[0]
    if isinstance(first, torch.Tensor):
        same = all(isinstance(s, torch.Tensor) and s.shape == first.shape for s in states)
        return torch.stack(states).mean(0).to(first.dtype) if same and first.is_floating_point() else first
    if isinstance(first, float):
        return sum(states) / len(states) if all(isinstance(s, float) for s in states) else first
    if isinstance(first, dict):
        if all(isinstance(s, dict) and s.keys() == first.keys() for s in states):
            return {k: mean_state([s[k] for s in states]) for k in first}
        return first
    if isinstance(first, (list, tuple)):
        if all(isinstance(s, type(first)) and len(s) == len(first) for s in states):
            return type(first)(mean_state(list(column)) for column in zip(*states))
        return first
    return first


def finished(state: dict, stored: TrainConfig, wanted: TrainConfig) -> bool:
    """Whether a checkpoint has nothing left to train for `wanted`: all its epochs, or with AdaScale (which ends when
    its schedule is done, after however many epochs) its scale-invariant steps, unless `wanted` adds epochs."""
    if wanted.recipe.lr_scaling != "adascale":
        return state["epoch"] >= wanted.recipe.epochs
    return wanted.recipe.epochs == stored.recipe.epochs and AdaScaleFactor(**state["scheduler"]["lr_lambdas"][0]).done


def resume_config(run_dir: Path, given: dict) -> TrainConfig:
    """The stored configuration of `run_dir`, with the runtime options in `given`; UsageError on any other change."""
    state = load_latest(run_dir, say=True)
    try:
        stored = TrainConfig.from_dict(state["config"])
    except (TypeError, UsageError) as err:
        raise UsageError(f"`resume` {run_dir}: its stored configuration is not usable ({err})") from None
    if stored.periodic.peer:
        raise UsageError(f"`resume` {run_dir}: a `peer` {stored.periodic.peer} run does not resume (the peer keeps "
                         "its global parameters to itself); start it again")
    wanted = TrainConfig.from_dict({**stored.to_dict(), **given})
    conflicts = wanted.incompatible_with(stored)
    if conflicts:
        name = conflicts[0]
        raise UsageError(f"`resume` {run_dir}: `{name}` {wanted.to_dict()[name]!r} differs from the run's "
                         f"{stored.to_dict()[name]!r}; a resumed run keeps its own configuration")
    if wanted.recipe.epochs < stored.recipe.epochs:
        raise UsageError(f"`resume` {run_dir}: `epochs` {wanted.recipe.epochs} is fewer than the run's "
                         f"{stored.recipe.epochs}; a resumed run may only train longer")
    if finished(state, stored, wanted):
        raise UsageError(f"`resume` {run_dir}: the run already finished all {wanted.recipe.epochs} epochs "
                         "(`epochs` more continues it)")
    changed = wanted.inexact_changes(stored)
    if changed:
        now, was = flatten(wanted), flatten(stored)
        print("scalesgd: warning: " + as_flags(", ".join(f"`{name}` {now[name]} (was {was[name]})"
                                                         for name in changed))
              + ": the resumed run is no longer exactly the uninterrupted one", file=sys.stderr)
    wanted.output.run_dir = str(run_dir)
    return wanted


def save_atomic(state: dict, path: Path, keep_previous: Path | None = None) -> None:
    """Write `state` to a temporary file beside `path`, fsync it, then rename over `path`.

    With `keep_previous`, what `path` held becomes that file first (a hard link renamed into place), so at every
    moment `path` is a whole checkpoint, old or new, and the one before survives beside it.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous is not None and path.exists():
            linked = Path(tmp).with_suffix(".prev.tmp")
            os.link(path, linked)
            os.replace(linked, keep_previous)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except Exception as err:
        if not disk_full(err):
            raise
        kept = "previous checkpoint kept" if path.exists() else "no checkpoint had been written yet"
        raise NoSpace(f"no space left writing checkpoint {path} ({kept})") from None
    finally:
        for leftover in Path(path.parent).glob(f".{path.name}.*.tmp"):
            leftover.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable: a rename lives in the directory's own blocks."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temporaries(run_dir: Path) -> None:
    """Temporary files a killed writer left in `run_dir` (never a whole checkpoint)."""
    for leftover in Path(run_dir).glob(f".{CHECKPOINT_NAME}.*.tmp"):
        leftover.unlink(missing_ok=True)


def load_latest(run_dir: Path, say: bool = False) -> dict:
    """The latest checkpoint of `run_dir`, or the one before it where the latest is unreadable (`say`: with one
    line saying so); UsageError naming both when neither can be read."""
    latest, previous = Path(run_dir) / CHECKPOINT_NAME, Path(run_dir) / PREVIOUS_CHECKPOINT_NAME
    try:
        return load_whole(latest)
    except UsageError as err:
        if not previous.is_file():
            raise
        try:
            state = load_whole(previous)
        except UsageError as before:
            raise UsageError(f"neither checkpoint of {run_dir} can be read: {latest.name} "
                             f"({_reason(err) if latest.is_file() else 'missing'}), nor the one before, "
                             f"{previous.name} ({_reason(before)}); the run cannot be resumed") from None
        if say:
            print(f"scalesgd: {latest.name} is unreadable ({_reason(err)}); resuming from {previous.name}, "
                  f"epoch {state['epoch']}", file=sys.stderr)
        return state


def _reason(err: UsageError) -> str:
    text = str(err)
    return text[text.find("(") + 1:text.rfind(")")] if "(" in text else text


def load(path: Path) -> dict:
    """Load a checkpoint safely (no arbitrary unpickling); UsageError if it is missing or not ours."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no checkpoint at {path}; `resume` takes a run directory that has finished "
                         f"at least one epoch")
    if path.stat().st_size == 0:
        raise UsageError(f"{path} is not a readable scalesgd checkpoint (an empty file)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 (any unreadable file is bad input here)
        first_line = str(err).strip().splitlines()[0].split(". ")[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"{path} is not a readable scalesgd checkpoint ({first_line})") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise UsageError(f"{path} is not a scalesgd checkpoint: missing keys {missing}")
    return state


def load_whole(path: Path) -> dict:
    """`load`, and the folders it names (a sharded run's shards, each rank's own state) checked readable too
    (UsageError naming what is damaged)."""
    state = load(path)
    damaged = shards.problem(Path(path).parent / state["shards"]) if state.get("shards") else None
    if damaged is None and state.get("rank_states"):
        damaged = rank_states.problem(Path(path).parent / state["rank_states"], state["ranks"])
    if damaged:
        raise UsageError(f"{path} is not a readable scalesgd checkpoint ({damaged})")
    return state
