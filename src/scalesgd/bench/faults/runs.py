"""What every fault scenario shares: the runs it starts, their workers and ranks, waiting, what a run said, a resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from scalesgd.errors import UsageError
from scalesgd.runtime.forked import NAME_PREFIX
from scalesgd.train import checkpoint

# a short run that checkpoints mid-epoch and carries per-rank codec state (top-k residuals)
TRAIN = ["--quiet", "--dataset", "synthetic", "--samples", "2400", "--image-size", "12", "--model", "resnet8",
         "--batch-size", "96", "--epochs", "4", "--warmup-epochs", "1", "--seed", "3", "--engine", "scalesgd",
         "--codec", "topk", "--density", "0.05", "--checkpoint-every", "4"]
POLL_S = 0.05
# a streamed image folder (`scalesgd data fake`), read by one loader process per rank, checkpointed every 2 steps
TREE = ["--classes", "4", "--per-class", "72", "--size", "48x40", "--val-per-class", "4", "--seed", "0"]
IMAGES = ["--quiet", "--dataset", "imagefolder", "--image-size", "24", "--model", "resnet8", "--batch-size", "12",
          "--epochs", "3", "--warmup", "none", "--seed", "4", "--loader-workers", "1", "--checkpoint-every", "2"]
TRAIN_EPOCHS, IMAGE_EPOCHS = (int(argv[argv.index("--epochs") + 1]) for argv in (TRAIN, IMAGES))
SKIPPED = "skipped: "


class Settings(Protocol):
    """`scalesgd bench faults`'s options as the scenarios read them (`FaultsBenchConfig`, beside the scenarios'
    table, which imports them)."""

    workers: int
    kills: int
    timeout: float
    seed: int


@dataclass(frozen=True)
class Outcome:
    """One scenario: what was done, seconds from the fault to the end, what happened, and whether it should."""

    scenario: str
    fault: str
    seconds: float
    outcome: str
    ok: bool


def _train(run_dir: Path, cfg: Settings, *extra: str, base: list[str] = TRAIN) -> subprocess.Popen:
    return _scalesgd("train", "--run-dir", str(run_dir), "--workers", str(cfg.workers), "--timeout",
                     str(cfg.timeout), *base, *extra)


def _scalesgd(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scalesgd", *argv], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def workers_of(proc: subprocess.Popen) -> list[int]:
    """The workers a launcher started: its children, or the children of the fork server it started them from."""
    workers = []
    for child in children_of(proc.pid):
        helper = _cmdline(child)
        if "multiprocessing.forkserver" in helper:
            workers += children_of(child)
        elif "multiprocessing.resource_tracker" not in helper:
            workers.append(child)
    return workers


def children_of(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def rank_of(pid: int) -> int:
    """A worker's rank: in a forked worker's name (scalesgd-r<rank>), else in the environment it was started with."""
    name = Path(f"/proc/{pid}/comm").read_text().strip()
    if name.startswith(NAME_PREFIX) and name[len(NAME_PREFIX):].isdigit():
        return int(name[len(NAME_PREFIX):])
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(e for e in env if e.startswith(b"RANK=")).split(b"=", 1)[1])


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _until(condition: Callable[[], bool], limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(POLL_S)
    return False


def _started(proc: subprocess.Popen, run_dir: Path, workers: int) -> list[int]:
    """The workers of a run once it has checkpointed (RuntimeError if it ended first)."""
    if not _until(lambda: proc.poll() is not None or (run_dir / "checkpoint.pt").exists(), 300) or proc.poll():
        raise RuntimeError(f"the run in {run_dir} ended before its first checkpoint ({proc.poll()})")
    pids = workers_of(proc)
    if len(pids) != workers:
        raise RuntimeError(f"expected {workers} workers, found {len(pids)}")
    return pids


def _end(proc: subprocess.Popen, limit_s: float = 300) -> tuple[int, list[str]]:
    try:
        _, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def _said(lines: list[str]) -> str:
    return " / ".join(lines) if lines else "(nothing)"


def _kept(run_dir: Path) -> str:
    """Where the checkpoint a stopped run kept stands, read as a resume reads it (weights_only)."""
    try:
        state = checkpoint.load(run_dir / "checkpoint.pt")
    except UsageError as err:  # the promise broken: say how
        return f"checkpoint UNREADABLE ({err})"
    return f"checkpoint kept at epoch {state['epoch']} step {state.get('step', 0)}"


def _epoch(run_dir: Path) -> int:
    """The epoch a run's checkpoint stands at (-1 where there is none to read)."""
    try:
        return checkpoint.load(run_dir / "checkpoint.pt")["epoch"]
    except UsageError:
        return -1


def _resumed(run_dir: Path, epochs: int, *launch: str) -> tuple[bool, str]:
    """`train --resume` (after `launch`, e.g. a testbed's `testbed run … --`): whether it went on to the end."""
    code, lines = _end(_scalesgd(*launch, *(["scalesgd"] if launch else []), "train", "--resume", str(run_dir)))
    epoch = _epoch(run_dir)
    done = code == 0 and epoch == epochs
    return done, (f"resumed to epoch {epoch} of {epochs}" if done
                  else f"resume FAILED (exit {code}, epoch {epoch}: {_said(lines)})")


def _stopped_and_resumed(name: str, fault: str, took: float, code: int, lines: list[str], run_dir: Path,
                         expected: tuple[str, ...], epochs: int, *launch: str, status: int | None = None) -> Outcome:
    """A run that a fault stopped: one line saying each of `expected`, a non-zero `status` (any, if None), its
    checkpoint whole, and a resume that goes on to the end."""
    kept = _kept(run_dir)
    done, resumed = _resumed(run_dir, epochs, *launch)
    said_once = len(lines) == 1 and all(part in lines[0] for part in expected)
    right_status = code != 0 if status is None else code == status
    return Outcome(name, fault, took, f"exit {code}: {_said(lines)}; {kept}; {resumed}",
                   said_once and right_status and "UNREADABLE" not in kept and done)


def _fake_tree(folder: Path) -> Path:
    """A small ImageNet-layout tree of JPEGs, as `scalesgd data fake` writes it (the same each time)."""
    code, lines = _end(_scalesgd("data", "fake", "--out", str(folder), *TREE))
    if code:
        raise RuntimeError(f"`scalesgd data fake` failed: {_said(lines)}")
    return folder.resolve()


def _on_images(cfg: Settings, run_dir: Path) -> tuple[Path, Path, subprocess.Popen, list[int]]:
    """(the tree, the run's directory, the run, its workers) once a run on a fresh tree has checkpointed."""
    tree = _fake_tree(run_dir / "tree")
    run = run_dir / "run"
    proc = _train(run, cfg, "--data-dir", str(tree), base=IMAGES)
    return tree, run, proc, _started(proc, run, cfg.workers)


def loader_of(pid: int) -> int:
    """A worker's oldest child: the training set's loader process (the test set's starts at the first evaluation)."""
    children = children_of(pid)
    if not children:
        raise RuntimeError(f"worker {pid} has no data loader process")
    return min(children, key=lambda c: int(Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[19]))
