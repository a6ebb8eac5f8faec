"""`scalesgd bench elastic-train`: `scalesgd train --local-steps H` on local workers with one worker SIGKILLed part-way,
as a user's run meets it — elastic (the launcher restarts the worker alone; the others go on) against the stop-the-
world restart (`--max-restarts`: every worker again from the last checkpoint) and both fault-free: the run's wall
time, the time the fault cost, the final accuracy, and for the elastic run the seconds from the kill to the
survivors' next round and to the restarted worker's first round. With `-slow`, one worker runs on half the CPU of the
others all run instead: the steps the plan gave it, when it first took part and the rounds' pace from then on."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from scalesgd import checks, output
from scalesgd.bench import quality_report
from scalesgd.bench.elastic.injector import cpu_quota
from scalesgd.options import Options, option, words
from scalesgd.runtime.forked import worker_pid
from scalesgd.train import metrics
from scalesgd.train.rundir import METRICS_NAME

MODES = ("elastic", "elastic-kill", "restart", "restart-kill")
SLOW = ("elastic-slow", "restart-slow")  # worker rank 1 at half the CPU of the others all run
DUTY_S = 0.005  # without cgroups: stopped 5 ms of every 10 ms, finer than a step (~25 ms), not in bursts
POLL_S = 0.05


@dataclass
class ElasticTrainBenchConfig(Options):
    """`scalesgd bench elastic-train`: a worker killed in `scalesgd train`, elastic against restart."""

    modes: tuple[str, ...] = option(MODES, "runs: elastic or restart (--max-restarts), fault-free, with a kill or "
                                    "with a worker at half the CPU of the others (-slow)", parse=words,
                                    choices=lambda: MODES + SLOW,
                                    check=checks.distinct)
    workers: int = option(3, "workers", check=checks.within(2, 8))
    runs: int = option(3, "runs of each mode", check=checks.within(1, 20))
    epochs: int = option(10, "epochs of digits on resnet8, batch 96, DiLoCo fp8", check=checks.within(2, 100))
    local_steps: int = option(4, "DiLoCo's H: inner steps a round", check=checks.within(1, 1000))
    kill_after: int = option(5, "the kill, after this many rounds", check=checks.within(1, 10000))
    out: str = option("", "output directory", shown_default="runs/bench/elastic-train-<timestamp>",
                      check=checks.output_dir)


TRAIN = ["train", "--quiet", "--dataset", "digits", "--model", "resnet8", "--batch-size", "96", "--warmup", "none",
         "--codec", "fp8", "--max-restarts", "1"]


def run(cfg: ElasticTrainBenchConfig, command: str) -> int:
    results = [one_run(cfg, mode, seed) for mode in cfg.modes for seed in range(cfg.runs)]
    columns = ["mode", "wall, s", "cost of the fault or the slow worker, s", "training clock, s",
               "kill → next round, s", "kill → worker back in a round, s",
               f"slow worker's steps a round (of {cfg.local_steps})", "slow worker's first round, clock s",
               "a round from then on, s", "final accuracy, %"]
    rows = [row(mode, [r for r in results if r["mode"] == mode], results) for mode in cfg.modes]
    output.write(Path(cfg.out), "elastic-train", {"config": cfg.to_dict(), "results": results}, columns, rows,
                 command)
    output.console().print(output.rich_table("a worker killed in scalesgd train", columns, rows))
    return 0 if all(r["code"] == 0 for r in results) else 1


def row(mode: str, runs: list[dict], everyone: list[dict]) -> list:
    fault_free = mode.removesuffix("-kill").removesuffix("-slow")
    free = [r["wall_s"] for r in everyone if r["mode"] == fault_free]
    cost = [r["wall_s"] - statistics.median(free) for r in runs] if mode != fault_free and free else []
    return [mode, spread([r["wall_s"] for r in runs]), spread(cost), spread([r.get("train_s") for r in runs]),
            spread([r.get("to_round_s") for r in runs]),
            spread([r.get("back_s") for r in runs]), spread([r.get("slow_steps") for r in runs]),
            spread([r.get("slow_in_s") for r in runs]), spread([r.get("round_s") for r in runs], "{:.3f}"),
            spread([100 * r["final_test_acc"] for r in runs], "{:.1f}")]


def spread(values: list, form: str = "{:.2f}") -> str:
    return quality_report.spread([v for v in values if v is not None], form)


def one_run(cfg: ElasticTrainBenchConfig, mode: str, seed: int) -> dict:
    """`scalesgd train` in a process of its own; with a kill, worker rank 1 SIGKILLed after `kill_after` rounds."""
    elastic, kill, slow = mode.startswith("elastic"), mode.endswith("-kill"), mode.endswith("-slow")
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        argv = [sys.executable, "-m", "scalesgd", *TRAIN, "--workers", str(cfg.workers), "--epochs", str(cfg.epochs),
                "--seed", str(seed), "--local-steps", str(cfg.local_steps), "--run-dir", str(run_dir),
                *(["--elastic"] if elastic else [])]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        killed = None
        if slow:
            slowed = threading.Thread(target=half_speed, args=(proc, cfg.workers), daemon=True)
            slowed.start()
        if kill:
            while proc.poll() is None and rounds_done(run_dir, elastic, cfg.local_steps) < cfg.kill_after:
                time.sleep(POLL_S)
            victim = worker_pid(1, proc.pid)
            if victim is not None:
                os.kill(victim, signal.SIGKILL)
                killed = time.time()
        _, err = proc.communicate()
        result = {"mode": mode, "seed": seed, "code": proc.returncode, "wall_s": time.perf_counter() - start,
                  "stderr": err[-2000:]}
        summary = run_dir / "summary.json"
        said = json.loads(summary.read_text()) if summary.exists() else {}
        result.update(final_test_acc=said.get("final_test_acc", 0.0), train_s=said.get("train_s"))
        log = records(run_dir, "round") if elastic else []
        slow_steps = [r["planned"][r["members"].index(m)] for r in log for m in r["members"]
                      if m.startswith("host-w1-") and len(r["planned"]) == len(r["members"])]
        if slow and slow_steps:  # the plan made at each round for the round after it
            result.update(slow_steps=statistics.fmean(slow_steps))
        if log:  # the round the slow worker (rank 1) first took part in, and the clock's pace from there on
            first = next((i for i, r in enumerate(log) if any(m.startswith("host-w1-") for m in r["members"])), 0)
            clocks = [r["train_s"] for r in log[first:]]
            result.update(slow_in_s=clocks[0] if slow else None,
                          round_s=statistics.median(b - a for a, b in zip(clocks, clocks[1:])) if len(clocks) > 1
                          else None,
                          rounds=[{k: r[k] for k in ("round", "train_s", "seconds", "planned")} | {
                              "members": len(r["members"])} for r in log])
        if elastic and killed is not None:
            after = [r["at"] for r in log if r["at"] > killed]
            back = [r["at"] for r in log if r["at"] > killed and any(m.startswith("host-w1-") for m in r["members"])]
            result.update(to_round_s=after[0] - killed if after else None, back_s=back[0] - killed if back else None)
    return result


def half_speed(proc: subprocess.Popen, workers: int = 2) -> None:
    """Worker rank 1 of `proc`'s run at half the CPU the others get, once it has started: a cgroup's CPU quota
    (half of its share of the machine's cores, in every 10 ms) where this process may write one, else stopped for
    half of every 2 × DUTY_S seconds (signals cost a little more than the half)."""
    victim = None
    while proc.poll() is None and victim is None:
        victim = worker_pid(1, proc.pid)
        time.sleep(POLL_S)
    if victim is None:
        return
    share = min(1.0, (os.cpu_count() or 1) / workers) / 2
    with cpu_quota(victim, share) as held:
        while not held and proc.poll() is None:
            try:
                os.kill(victim, signal.SIGSTOP)
                time.sleep(DUTY_S)
                os.kill(victim, signal.SIGCONT)
                time.sleep(DUTY_S)
            except ProcessLookupError:
                return
        proc.wait()


def records(run_dir: Path, kind: str) -> list[dict]:
    """The run's metrics records of `kind` so far (a line being written left out)."""
    return [r for r in metrics.read(run_dir / METRICS_NAME) if r["kind"] == kind]


def rounds_done(run_dir: Path, elastic: bool, local_steps: int) -> int:
    """Rounds the run committed so far: its round records, or (every H steps) its iterations."""
    if elastic:
        return len(records(run_dir, "round"))
    iters = records(run_dir, "iter")
    return iters[-1]["iter"] // local_steps if iters else 0
