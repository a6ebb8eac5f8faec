"""`scalesgd bench faults`: what a training run does when it is hurt — workers killed or stopped, the launcher sent
a signal or killed, the run directory torn, many kills in one run — timed from the fault to the end, each with
whether the outcome was the one promised."""

from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from scalesgd import checks, output
from scalesgd.options import Options, option, words

# a short run that checkpoints mid-epoch and carries per-rank codec state (top-k residuals)
TRAIN = ["--quiet", "--dataset", "synthetic", "--samples", "2400", "--image-size", "12", "--model", "resnet8",
         "--batch-size", "96", "--epochs", "4", "--warmup-epochs", "1", "--seed", "3", "--engine", "scalesgd",
         "--codec", "topk", "--density", "0.05", "--checkpoint-every", "4"]
POLL_S = 0.05


@dataclass
class FaultsBenchConfig(Options):
    """`scalesgd bench faults`: inject each fault into a short `scalesgd train` run; time to exit and outcome."""

    scenarios: tuple[str, ...] = option(("kill-worker", "sigterm", "sighup", "kill-launcher", "stop-worker",
                                         "torn-run-dir", "soak"), "which faults", parse=words,
                                        choices=lambda: SCENARIOS, check=checks.distinct)
    workers: int = option(3, "workers of each run", check=checks.within(2, 8))
    kills: int = option(5, "kills of a random rank at random moments in the soak (which restarts each time)",
                        check=checks.within(1, 100))
    timeout: float = option(10.0, "each run's --timeout: a stopped worker must be named within it and 10 s",
                            check=checks.within(1, 300))
    seed: int = option(0, "which moments and ranks the soak kills", check=checks.seed)
    out: str = option("", "output directory", shown_default="runs/bench/faults-<timestamp>", check=checks.output_dir)


@dataclass(frozen=True)
class Outcome:
    """One scenario: what was done, seconds from the fault to the end, what happened, and whether it should."""

    scenario: str
    fault: str
    seconds: float
    outcome: str
    ok: bool


def run(cfg: FaultsBenchConfig, command: str) -> int:
    """Every scenario in turn, each in a directory of its own under `out`; the table, and status 1 if any failed."""
    out = Path(cfg.out)
    results = [SCENARIOS[name](cfg, out / name) for name in cfg.scenarios]
    columns = ["scenario", "fault", "seconds to the end", "outcome", "as promised"]
    rows = [[r.scenario, r.fault, f"{r.seconds:.1f}", r.outcome, "yes" if r.ok else "**no**"] for r in results]
    output.write(out, "faults", {"config": cfg.to_dict(), "results": [r.__dict__ for r in results]}, columns, rows,
                 command)
    output.console().print(output.rich_table("faults", columns, rows))
    if all(r.ok for r in results):
        clean(out)  # the runs are kept only where something went wrong, to look into
        return 0
    return 1


def _train(run_dir: Path, cfg: FaultsBenchConfig, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(run_dir), "--workers",
                             str(cfg.workers), "--timeout", str(cfg.timeout), *TRAIN, *extra],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def workers_of(proc: subprocess.Popen) -> list[int]:
    """The processes a launcher started (its children)."""
    try:
        return [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def rank_of(pid: int) -> int:
    """A worker's rank, from the environment its launcher gave it."""
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


def _signal_rank_one(cfg: FaultsBenchConfig, run_dir: Path, sig: signal.Signals) -> tuple[int, list[str], float]:
    """Send `sig` to rank 1 of a run once it has checkpointed: the run's status, its lines, seconds to its end."""
    proc = _train(run_dir, cfg)
    victim = next(p for p in _started(proc, run_dir, cfg.workers) if rank_of(p) == 1)
    os.kill(victim, sig)
    start = time.monotonic()
    code, lines = _end(proc)
    return code, lines, time.monotonic() - start


def kill_worker(cfg: FaultsBenchConfig, run_dir: Path) -> Outcome:
    code, lines, took = _signal_rank_one(cfg, run_dir, signal.SIGKILL)
    return Outcome("kill-worker", "SIGKILL to rank 1", took, f"exit {code}: {_said(lines)}",
                   code != 0 and len(lines) == 1 and "worker rank 1 was killed by SIGKILL" in lines[0])


def signal_launcher(sig: signal.Signals) -> Callable[[FaultsBenchConfig, Path], Outcome]:
    def scenario(cfg: FaultsBenchConfig, run_dir: Path) -> Outcome:
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


def kill_launcher(cfg: FaultsBenchConfig, run_dir: Path) -> Outcome:
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


def stop_worker(cfg: FaultsBenchConfig, run_dir: Path) -> Outcome:
    code, lines, took = _signal_rank_one(cfg, run_dir, signal.SIGSTOP)
    return Outcome("stop-worker", f"SIGSTOP to rank 1, --timeout {cfg.timeout:g}", took, f"exit {code}: {_said(lines)}",
                   len(lines) == 1 and "worker rank 1 stopped responding" in lines[0] and took < cfg.timeout + 10)


def torn_run_dir(cfg: FaultsBenchConfig, run_dir: Path) -> Outcome:
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


def soak(cfg: FaultsBenchConfig, run_dir: Path) -> Outcome:
    """`kills` SIGKILLs of a random rank at random moments of one run with as many restarts; its parameters
    against an uninterrupted run's."""
    chance = random.Random(cfg.seed)
    soaked, whole = run_dir / "soaked", run_dir / "whole"
    proc = _train(soaked, cfg, "--max-restarts", str(cfg.kills))
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
        if _until(lambda: proc.poll() is not None or (victim not in workers_of(proc)
                                                      and len(workers_of(proc)) == cfg.workers), 120):
            recoveries.append(time.monotonic() - killed)
    code, lines = _end(proc, 1800)
    took = time.monotonic() - start
    reference = _train(whole, cfg)
    ref_code, _ = _end(reference, 1800)
    same = code == 0 and ref_code == 0 and _same_parameters(soaked, whole)
    restarts = sum("restarting the workers" in line for line in lines)
    spread = (f"; back in {statistics.median(recoveries):.1f} s median, {max(recoveries):.1f} max"
              if recoveries else "")
    return Outcome("soak", f"{kills} SIGKILLs of random ranks, --max-restarts {cfg.kills}", took,
                   f"exit {code}, {restarts} restarts{spread}; parameters "
                   f"{'bit-identical to' if same else 'DIFFER from'} an uninterrupted run's",
                   same and restarts == kills)


def _same_parameters(a: Path, b: Path) -> bool:
    x, y = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (a, b))
    return x["epoch"] == y["epoch"] and all(torch.equal(t, y["model"][k]) for k, t in x["model"].items())


SCENARIOS: dict[str, Callable[[FaultsBenchConfig, Path], Outcome]] = {
    "kill-worker": kill_worker, "sigterm": signal_launcher(signal.SIGTERM), "sighup": signal_launcher(signal.SIGHUP),
    "kill-launcher": kill_launcher, "stop-worker": stop_worker, "torn-run-dir": torn_run_dir, "soak": soak,
}


def clean(out: Path) -> None:
    """Remove the scenarios' run directories, keeping faults.json and faults.md."""
    for child in out.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
