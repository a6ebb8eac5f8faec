"""The process scenarios: workers killed or stopped, the launcher signalled or killed, a torn run directory, a soak."""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from scalesgd.bench.faults.runs import (
    TRAIN_EPOCHS,
    Outcome,
    Settings,
    _end,
    _said,
    _started,
    _train,
    _until,
    alive,
    rank_of,
    workers_of,
)


def _signal_rank_one(cfg: Settings, run_dir: Path, sig: signal.Signals) -> tuple[int, list[str], float]:
    """Send `sig` to rank 1 of a run once it has checkpointed: the run's status, its lines, seconds to its end."""
    proc = _train(run_dir, cfg)
    victim = next(p for p in _started(proc, run_dir, cfg.workers) if rank_of(p) == 1)
    os.kill(victim, sig)
    start = time.monotonic()
    code, lines = _end(proc)
    return code, lines, time.monotonic() - start


def kill_worker(cfg: Settings, run_dir: Path) -> Outcome:
    code, lines, took = _signal_rank_one(cfg, run_dir, signal.SIGKILL)
    return Outcome("kill-worker", "SIGKILL to rank 1", took, f"exit {code}: {_said(lines)}",
                   code != 0 and len(lines) == 1 and "worker rank 1 was killed by SIGKILL" in lines[0])


def signal_launcher(sig: signal.Signals) -> Callable[[Settings, Path], Outcome]:
    def scenario(cfg: Settings, run_dir: Path) -> Outcome:
        proc = _train(run_dir, cfg)
        workers = _started(proc, run_dir, cfg.workers)
        proc.send_signal(sig)
        start = time.monotonic()
        code, lines = _end(proc)
        gone = _until(lambda: not any(map(alive, workers)), 30)
        took = time.monotonic() - start
        return Outcome(sig.name.lower(), f"{sig.name} to the launcher", took,
                       f"exit {code}: {_said(lines)}; workers {'gone' if gone else 'STILL RUNNING'}",
                       code == 128 + sig and gone and len(lines) == 1)
    return scenario


def kill_launcher(cfg: Settings, run_dir: Path) -> Outcome:
    proc = _train(run_dir, cfg)
    workers = _started(proc, run_dir, cfg.workers)
    proc.kill()
    start = time.monotonic()
    gone = _until(lambda: not any(map(alive, workers)), 30)
    took = time.monotonic() - start
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    return Outcome("kill-launcher", "SIGKILL to the launcher", took,
                   f"{'every worker ended' if gone else 'workers STILL RUNNING'} (parent-death signal)", gone)


def stop_worker(cfg: Settings, run_dir: Path) -> Outcome:
    code, lines, took = _signal_rank_one(cfg, run_dir, signal.SIGSTOP)
    return Outcome("stop-worker", f"SIGSTOP to rank 1, --timeout {cfg.timeout:g}", took, f"exit {code}: {_said(lines)}",
                   len(lines) == 1 and "worker rank 1 stopped responding" in lines[0] and took < cfg.timeout + 10)


def torn_run_dir(cfg: Settings, run_dir: Path) -> Outcome:
    """A finished 2-epoch run's latest checkpoint cut in half, a temporary file and a torn metrics line left."""
    proc = _train(run_dir, cfg, "--epochs", "2")
    code, lines = _end(proc)
    if code:
        raise RuntimeError(f"the run to damage failed: {_said(lines)}")
    (run_dir / "summary.json").unlink()
    whole = (run_dir / "checkpoint.pt").read_bytes()
    (run_dir / "checkpoint.pt").write_bytes(whole[: len(whole) // 2])
    (run_dir / ".checkpoint.pt.x.tmp").write_bytes(b"")
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "it')
    start = time.monotonic()
    code, lines = _end(subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--resume", str(run_dir)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    took = time.monotonic() - start
    epoch = torch.load(run_dir / "checkpoint.pt", weights_only=True)["epoch"]
    return Outcome("torn-run-dir", "checkpoint.pt cut in half, a .tmp left, metrics.jsonl's last line torn", took,
                   f"exit {code}: {_said(lines)}; ended at epoch {epoch}",
                   code == 0 and epoch == 2 and len(lines) == 1 and "resuming from checkpoint.prev.pt" in lines[0]
                   and not list(run_dir.glob(".*.tmp")))


def soak(cfg: Settings, run_dir: Path) -> Outcome:
    """`kills` SIGKILLs of a random rank at random moments (1.6 s apart on average) of one run with as many
    restarts, an epoch a kill so that every kill lands before it ends; its parameters against an uninterrupted
    run's."""
    chance = random.Random(cfg.seed)
    soaked, whole = run_dir / "soaked", run_dir / "whole"
    epochs = ("--epochs", str(max(TRAIN_EPOCHS, cfg.kills)))
    proc = _train(soaked, cfg, "--max-restarts", str(cfg.kills), *epochs)
    _started(proc, soaked, cfg.workers)
    start, recoveries, kills = time.monotonic(), [], 0
    while kills < cfg.kills and proc.poll() is None:
        time.sleep(chance.uniform(0.2, 3.0))
        workers = workers_of(proc)
        if len(workers) != cfg.workers:
            continue
        victim = chance.choice(workers)
        os.kill(victim, signal.SIGKILL)
        killed, kills = time.monotonic(), kills + 1
        if _until(lambda victim=victim: proc.poll() is not None or (victim not in workers_of(proc)
                                                                    and len(workers_of(proc)) == cfg.workers), 120):
            recoveries.append(time.monotonic() - killed)
    code, lines = _end(proc, 1800)
    took = time.monotonic() - start
    reference = _train(whole, cfg, *epochs)
    ref_code, _ = _end(reference, 1800)
    same = code == 0 and ref_code == 0 and _same_parameters(soaked, whole)
    restarts = sum("restarting the workers" in line for line in lines)
    spread = (f"; back in {statistics.median(recoveries):.1f} s median, {max(recoveries):.1f} max"
              if recoveries else "")
    return Outcome("soak", f"{kills} SIGKILLs of random ranks, --max-restarts {cfg.kills}", took,
                   f"exit {code}, {restarts} restarts{spread}; parameters "
                   f"{'bit-identical to' if same else 'DIFFER from'} an uninterrupted run's",
                   same and restarts == kills == cfg.kills)


def _same_parameters(a: Path, b: Path) -> bool:
    x, y = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (a, b))
    return x["epoch"] == y["epoch"] and all(torch.equal(t, y["model"][k]) for k, t in x["model"].items())
