"""Starting a run: prepare its directory, then spawn local workers or join torchrun's group."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from scalesgd.config import TrainConfig, default_run_dir, option_name
from scalesgd.errors import EXIT_NON_FINITE, EXIT_PEER_LOST, EXIT_USAGE, UsageError
from scalesgd.train import checkpoint

CONFIG_NAME = "config.json"
LAUNCHED_MARK = "SCALESGD_LAUNCHED"
POLL_S = 0.1
KILL_GRACE_S = 5.0


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


def free_port(addr: str) -> int:
    """A port on `addr` that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def worker_env(rank: int, world: int, addr: str, port: int) -> dict:
    """The environment torchrun would give local worker `rank`, plus loopback for gloo."""
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               GROUP_RANK="0", MASTER_ADDR=addr, MASTER_PORT=str(port), **{LAUNCHED_MARK: "1"})
    if addr.startswith("127.") or addr == "localhost":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))  # as torchrun does
    return env


def spawn(cfg: TrainConfig, run_dir: Path, resume: bool) -> int:
    """Run `cfg.workers` local worker processes and supervise them; returns the exit status."""
    port = cfg.master_port or free_port(cfg.master_addr)
    cmd = [sys.executable, "-m", "scalesgd.train.worker", str(run_dir)] + (["--resume"] if resume else [])
    procs = [subprocess.Popen(cmd, env=worker_env(r, cfg.workers, cfg.master_addr, port))
             for r in range(cfg.workers)]
    try:
        return supervise(procs, cfg.timeout)
    except KeyboardInterrupt:
        stop(procs)
        print("scalesgd: interrupted; the last checkpoint is kept", file=sys.stderr)
        return 130


def supervise(procs: list[subprocess.Popen], timeout_s: float) -> int:
    """Wait for every worker; after the first failure give the rest `timeout_s` to stop, then kill them."""
    failures: list[tuple[int, int]] = []  # (rank, exit code) in the order they were seen
    deadline = None
    while True:
        for rank, p in enumerate(procs):
            if p.poll() not in (None, 0) and rank not in [r for r, _ in failures]:
                failures.append((rank, p.returncode))
        if all(p.returncode is not None for p in procs):
            break
        if failures and deadline is None:
            deadline = time.monotonic() + timeout_s
        if deadline is not None and time.monotonic() > deadline:
            stop(procs)
            break
        time.sleep(POLL_S)
    if not failures:
        return 0
    codes = [code for _, code in failures]
    if EXIT_USAGE in codes:
        return EXIT_USAGE  # rank 0 already said which input was bad
    if EXIT_NON_FINITE in codes:
        return EXIT_NON_FINITE  # rank 0 already said where the loss diverged
    rank, code = first_failure(failures)
    print(f"scalesgd: error: worker rank {rank} {describe_exit(code)}; the other workers were stopped",
          file=sys.stderr)
    return 1


def first_failure(failures: list[tuple[int, int]]) -> tuple[int, int]:
    """The earliest worker that failed on its own, rather than because a peer vanished."""
    return next(((r, c) for r, c in failures if c != EXIT_PEER_LOST), failures[0])


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code == EXIT_PEER_LOST:
        return "lost contact with its peers"
    return f"exited with status {code}"


def stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the workers that are still running, killing any that ignore SIGTERM."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + KILL_GRACE_S
    for p in procs:
        try:
            p.wait(max(end - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
