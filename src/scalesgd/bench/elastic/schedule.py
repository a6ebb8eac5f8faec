"""`scalesgd bench elastic-schedule`: `scalesgd train --local-steps H` on the testbed (one worker a node) under a fixed
failure schedule — a worker SIGKILLed (its launcher restarts it), a node frozen for 20 s, a link down for 20 s, in
turn every 30 s — elastic rounds against the stop-the-world restart (every worker again from the last checkpoint, as
torchrun's --max-restarts does) and the same run without faults. Per run: wall seconds from the launch to the target
validation loss (every evaluation's own seconds left out, a failed launch's too: checkpoints, start-ups and restarts
stay in), goodput (inner steps that reached the global model ÷ inner steps computed), the final loss, the bytes
each worker sent, and the seconds from each fault to the next committed round."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from scalesgd import checks, output
from scalesgd.bench.elastic import figure, spread
from scalesgd.bench.elastic.background import OnThread
from scalesgd.bench.elastic.injector import FAULTS, Injector, Schedule, Slowed, worker_of
from scalesgd.bench.elastic.launches import (
    LIMITED,
    REACHED,
    TargetWatch,
    finish,
    node_env,
    records_of,
    sent_by,
    summary_of,
)
from scalesgd.bench.elastic.torchft_schedule import run_torchft
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.options import Options, ints, option, words
from scalesgd.testbed import netns
from scalesgd.train import metrics
from scalesgd.train.rundir import CHECKPOINT_NAME, METRICS_NAME, SUMMARY_NAME

MODES = ("fault-free", "elastic-fault-free", "elastic", "restart", "torchft-fault-free", "torchft", "elastic-slow",
         "elastic-slow-grace", "fault-free-slow")
COORDINATOR_PORT = 29510
POLL_S = 0.25
TENTHS = "{:.1f}"  # seconds, MB and percentages in the table


@dataclass
class ScheduleBenchConfig(Options):
    """`scalesgd bench elastic-schedule`: elastic rounds and the restart under one failure schedule, on the testbed."""

    modes: tuple[str, ...] = option(MODES, "fault-free: no faults; elastic: --elastic rounds; restart: every worker "
                                    "restarted from the last checkpoint; elastic-fault-free: elastic rounds, no "
                                    "faults; torchft: torchft's DiLoCo with its fault tolerance (the peers extra); "
                                    "torchft-fault-free: the same, no faults; elastic-slow, fault-free-slow: "
                                    "elastic-fault-free and fault-free with node 1's worker held to a share of its "
                                    "part of the cores all run (--slow-share); elastic-slow-grace: elastic-slow with "
                                    "a grace window for a late member (--grace-s) instead of its steps planned", parse=words, choices=lambda: MODES,
                                    check=checks.distinct)
    seeds: tuple[int, ...] = option((0, 1, 2), "seeds, each a run of every mode", parse=ints)
    prefix: str = option("ssgd", "the testbed (`scalesgd testbed up --nodes N` first; node 0 hosts the coordinator "
                         "and is never faulted)")
    fault_every: float = option(30.0, "seconds between faults", check=checks.within(1, 3600))
    down_s: float = option(20.0, "seconds a node stays frozen or its link down", check=checks.within(0.1, 3600))
    faults: tuple[str, ...] = option(FAULTS, "the faults, in turn", parse=words, choices=lambda: FAULTS)
    target: float = option(2.2876, "the validation loss to reach (the default GPT's: DDP fp32's + 1 %)")
    slow_share: float = option(0.5, "-slow modes: the share of its fair part of the cores node 1's worker gets",
                               check=checks.within(0.05, 1))
    grace_s: float = option(2.0, "elastic-slow-grace: seconds a round waits for a late member (`scalesgd train "
                            "--elastic-grace`)", check=checks.within(0.1, 600))
    min_workers: int = option(2, "elastic: the fewest workers a round takes", check=checks.within(1, 64))
    max_restarts: int = option(50, "restarts a run (restart) or a worker (elastic) may take",
                               check=checks.within(0, 1000))
    limit_s: float = option(1200.0, "a run still going this long after its launch is stopped (its time to the target "
                            "is then what it reached by then)", check=checks.within(10, 86400))
    until_target: bool = option(False, "stop each run but torchft's once it reaches --target (its time to the "
                                "target alone; its final loss is then that evaluation's)")
    figure_seed: int | None = option(None, "the seed whose runs the picture draws", parse=int, shown_default="the lowest "
                                     "seed every mode ran")
    kept_only: bool = option(False, "the table from the runs kept in --out alone, none run (each mode's row over "
                             "the seeds it has)")
    out: str = option("", "output directory", shown_default="runs/bench/elastic-schedule-<timestamp>",
                      check=checks.output_dir)
    train_args: tuple[str, ...] = option((), "-- then `scalesgd train` options of every run (with --local-steps)",
                                         remainder=True)


def run(cfg: ScheduleBenchConfig, command: str) -> int:
    spec = netns.read_state(cfg.prefix)
    if not cfg.kept_only and (spec is None or spec.nodes < 2):
        print(f"scalesgd: error: --prefix {cfg.prefix}: no testbed of 2 or more nodes is up; start one with "
              f"`scalesgd testbed up --nodes 4 --prefix {cfg.prefix}`", file=sys.stderr)
        return 2
    out = Path(cfg.out)
    if cfg.kept_only:
        results = [summarise(json.loads(path.read_text()), cfg.target) for mode in cfg.modes for seed in cfg.seeds
                   if (path := out / "runs" / f"{mode}-{seed}.json").exists()]
    else:
        results = [kept_or_run(cfg, spec, mode, seed, out / "runs") for seed in cfg.seeds
                   for mode in cfg.modes]  # the modes take turns, so a slow spell of the machine hits them alike
    columns = ["mode", "seeds", "time to target, s", "× fault-free", "goodput, %", "final loss",
               "MB sent a worker", "faults", "fault → next round, s", "restarts", "members at the end, equal"]
    rows = [row(mode, [r for r in results if r["mode"] == mode], results) for mode in cfg.modes]
    output.write(out, "elastic-schedule", {"config": cfg.to_dict(), "testbed": spec and spec.to_dict(), "results": results},
                 columns, rows, command)
    figure.plot(out / "elastic-schedule.png", results, cfg.target, cfg.figure_seed)
    output.console().print(output.rich_table("training under a failure schedule", columns, rows))
    return 0 if all(r["code"] == 0 for r in results) else 1


def row(mode: str, runs: list[dict], everyone: list[dict]) -> list:
    free = {r["seed"]: r.get("to_target_s") for r in everyone if r["mode"] == "fault-free"}  # all fast, no faults
    ratio = [r["to_target_s"] / free[r["seed"]] for r in runs if r.get("to_target_s") and free.get(r["seed"])]
    missed = sum(r.get("to_target_s") is None for r in runs)
    reached = spread([r.get("to_target_s") for r in runs], TENTHS) + (
        f"; not reached in {missed} of {len(runs)}" if missed else "")
    return [mode, ",".join(str(r["seed"]) for r in runs), reached, spread(ratio),
            spread([100 * r["goodput"] for r in runs if r.get("goodput") is not None], TENTHS),
            spread([r.get("final_loss") for r in runs], "{:.4f}"), spread([r.get("mb_sent") for r in runs], TENTHS),
            spread([len(r["faults"]) for r in runs], "{:.0f}"),
            spread([s for r in runs for s in r["to_round_s"]], TENTHS), spread([r["restarts"] for r in runs], "{:.0f}"),
            spread([r.get("members_at_end") for r in runs], "{:.0f}")]


class Watcher(OnThread):
    """The run's metrics files read every POLL_S: when each round boundary was first seen, and the highest step
    each launch reached (a killed launch's unflushed tail aside)."""

    name = "metrics-watch"

    def __init__(self, files: list[Path], local_steps: int):
        super().__init__()
        self.files, self.local_steps = files, local_steps
        self.attempt, self.reached, self.boundaries, self.evaluations = 0, {0: (0, 0)}, [], {}
        self._lock = threading.Lock()  # read by its thread and at each restart

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.read()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.read()

    def read(self) -> None:
        with self._lock:
            self._read()

    def _read(self) -> None:
        first = self.reached[self.attempt][0]
        for path in self.files:
            try:
                records = metrics.read(path)
            except (UsageError, OSError):  # replaced under it by a resume, or removed: read it next time
                continue
            for record in records:
                if "eval_s" in record:  # every evaluation, a failed launch's too: off the clock the report reads
                    self.evaluations[record["at"]] = record
                step = record.get("iter")
                if record.get("kind") != "iter" or step is None or step <= first:
                    continue  # a resumed launch's records before its checkpoint are the last launch's
                top = self.reached[self.attempt][1]
                if step > top:
                    self.reached[self.attempt] = (first, step)
                    if step % self.local_steps == 0:
                        self.boundaries.append(time.time())

    def start_attempt(self, resumed_from: int) -> None:
        """A new launch from step `resumed_from`."""
        with self._lock:
            self.attempt += 1
            self.reached[self.attempt] = (resumed_from, resumed_from)

    def computed(self) -> int:
        """Steps the launches computed, each from where it started to the highest it was seen at."""
        return sum(top - first for first, top in self.reached.values())


def kept_or_run(cfg: ScheduleBenchConfig, spec, mode: str, seed: int, runs: Path) -> dict:
    """A run's figures: kept from an earlier call of the same command where it finished, else measured now (what
    it measured kept raw, the figures read from it here)."""
    kept = runs / f"{mode}-{seed}.json"
    if kept.exists():
        return summarise(json.loads(kept.read_text()), cfg.target)
    result = one_run(cfg, spec, mode, seed, runs / f"{mode}-{seed}")
    kept.write_text(json.dumps(result) + "\n")
    return summarise(result, cfg.target)


def one_run(cfg: ScheduleBenchConfig, spec, mode: str, seed: int, run_dir: Path) -> dict:
    """One run of `mode`, its faults injected from its launch on: what it logged."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    train = [*cfg.train_args, "--seed", str(seed), "--quiet"]
    local_steps = TrainConfig.from_argv(list(cfg.train_args)).periodic.local_steps
    schedule = Schedule(cfg.fault_every, cfg.down_s, cfg.faults)
    print(f"{mode}, seed {seed}", flush=True)
    launched = time.time()
    share = cfg.slow_share * min(1.0, (os.cpu_count() or 1) / spec.nodes)  # of a core: its fair part's share
    watch = TargetWatch(run_dir, cfg.target) if cfg.until_target and not mode.startswith("torchft") else None
    with (Slowed(spec, 1, share) if "-slow" in mode else contextlib.nullcontext()), (watch or contextlib.nullcontext()):
        reached = watch.reached if watch else None
        if mode.startswith("elastic"):
            result = run_elastic(cfg, spec, train, run_dir, schedule if mode == "elastic" else None,
                                 cfg.grace_s if mode.endswith("-grace") else None, reached)
        elif mode.startswith("torchft"):
            result = run_torchft(spec, train, run_dir, schedule if mode == "torchft" else None, local_steps,
                                 cfg.max_restarts, cfg.limit_s)
        else:
            result = run_restarted(cfg, spec, train, run_dir, schedule if mode == "restart" else None, local_steps,
                                   reached)
    if mode.endswith("-grace"):  # a member left out of a round loses its steps there, which no fault accounts for
        result["goodput"] = None
    if result["code"] == REACHED:  # stopped there by --until-target: a run that did what was asked
        result.update(code=0, stopped_at_target=True)
    result.update(mode=mode, seed=seed, launched=launched, wall_s=time.time() - launched, faults=schedule.log)
    final = sorted((r for r in records_of(result["dirs"]) if r["kind"] in ("eval", "epoch")), key=lambda r: r["at"])
    every = {r["at"]: r for r in [*final, *result.pop("evaluations", [])]}  # a failed launch's evaluations too
    sent = sent_by(result["dirs"])  # a run stopped at --limit-s wrote no summary: its last evaluation's count
    result.update(mb_sent=sent if sent is not None or not final else final[-1].get("bytes_sent", 0) / 1e6,
                  dirs=[str(d) for d in result["dirs"]],
                  evals=[{k: r.get(k) for k in ("iter", "at", "eval_s", "train_s", "test_loss")} for r in final],
                  evaluations=[{"at": at, "eval_s": r["eval_s"]} for at, r in sorted(every.items())])
    return result


def summarise(result: dict, target: float) -> dict:
    """The figures of a run from what it logged: the wall seconds to `target` and from each fault to the next round,
    with the seconds evaluations held the run up left out of both."""
    launched, evals = result["launched"], result["evals"]
    rounds = result.get("boundaries", [])
    spans = merged([(e["at"] - e["eval_s"], e["at"]) for e in result["evaluations"]  # two writers' at once: once
                    if not any(e["at"] - e["eval_s"] < at < e["at"] for at in rounds)])  # … and none the others
    # trained through (a member left out of the rounds, evaluating on its own), which held nobody up

    def evaluating(start: float, end: float) -> float:
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)

    hit = next((e for e in evals if (e.get("test_loss") or float("inf")) <= target), None)
    after = [(f["at"], min((at for at in rounds if at > f["at"]), default=None)) for f in result["faults"]]
    return {**result, "to_target_s": hit["at"] - launched - evaluating(launched, hit["at"]) if hit else None,
            "clock_to_target_s": hit.get("train_s") if hit else None,
            "final_loss": evals[-1].get("test_loss") if evals else None,
            "eval_s": sum(b - a for a, b in spans),
            "to_round_s": [b - a - evaluating(a, b) for a, b in after if b is not None] if "boundaries" in result
            else result.get("to_round_s", [])}


def merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of time spans, as disjoint spans in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def run_elastic(cfg: ScheduleBenchConfig, spec, train: list[str], run_dir: Path, schedule: Schedule | None,
                grace_s: float | None = None, reached: threading.Event | None = None) -> dict:
    """The coordinator on node 0, then a `--join` launch on every node (each restarts its worker alone); with
    `grace_s`, a round waits that long for a late member instead of planning a slow one's steps."""
    window = ["--join-timeout", str(grace_s)] if grace_s else []
    train = [*train, "--elastic-grace", str(grace_s)] if grace_s else train
    deadline = time.monotonic() + cfg.limit_s
    coordinator = subprocess.Popen(
        ["ip", "netns", "exec", spec.node(0), sys.executable, "-m", "scalesgd.elastic", "--min-workers",
         str(cfg.min_workers), "--host", spec.address(0), "--port", str(COORDINATOR_PORT), *window],
        stdout=subprocess.PIPE, text=True, env=node_env(spec, 0))
    address = coordinator.stdout.readline().strip()
    if not address:
        raise UsageError(f"the coordinator did not start on {spec.node(0)} (exit {coordinator.wait()})")
    dirs = [run_dir / f"node{i}" for i in range(spec.nodes)]
    launches = [subprocess.Popen(
        ["ip", "netns", "exec", spec.node(i), sys.executable, "-m", "scalesgd", "train", *train, "--join", address,
         "--max-restarts", str(cfg.max_restarts), "--run-dir", str(dirs[i])],
        env=node_env(spec, i), stderr=subprocess.PIPE, text=True) for i in range(spec.nodes)]
    errors = [[] for _ in launches]
    readers = [threading.Thread(target=lambda p=p, e=e: e.extend(p.stderr), daemon=True)
               for p, e in zip(launches, errors)]
    for reader in readers:
        reader.start()
    with (Injector(spec, schedule, lambda: all(p.poll() is None for p in launches)) if schedule
          else contextlib.nullcontext()):
        codes = [finish(p, deadline, reached, stacks=lambda n=i: worker_of(spec, n)) for i, p in enumerate(launches)]
    coordinator.send_signal(signal.SIGTERM)
    coordinator.wait(30)
    for reader in readers:
        reader.join(5)
    rounds = sorted({r["round"]: r for r in records_of(dirs) if r["kind"] == "round"}.values(),
                    key=lambda r: r["round"])
    committed = sum(r.get("weight", 0) for r in rounds)
    faults = schedule.log if schedule else []
    late = sum(r.get("late", 0) for r in rounds)  # charged to their fault below, yet reduced in a later round
    lost = max(0, sum(lost_steps(rounds, fault, launches[fault["node"]].pid) for fault in faults) - late)
    restarts = sum(1 for e in errors for line in e if "restarting it alone" in line)
    said = summary_of(dirs)
    failed = [code for code in codes if code not in (0, LIMITED, REACHED)]  # a worker's own error comes first
    return {"code": failed[0] if failed else max(codes, key=abs), "dirs": dirs, "boundaries": [r["at"] for r in rounds],
            "members": [[r["at"], len(r["members"])] for r in rounds],
            "goodput": committed / (committed + lost) if committed else None, "committed_steps": committed,
            "lost_steps_at_most": lost, "late_steps": late, "rounds": len(rounds), "restarts": restarts,
            "members_at_end": said.get("elastic", {}).get("members_at_end"),
            "stderr": ["".join(e[-20 if max(codes) != LIMITED else -400:]) for e in errors]}


def lost_steps(rounds: list[dict], fault: dict, launcher: int) -> int:
    """At most what the faulty node's worker computed for nothing: the steps planned for it in the round it was
    in when the fault struck (killed in it, or dropped from it while frozen or cut off). Its member names carry its
    launcher's process id (`join-HOST-PID-…`)."""
    before = [r for r in rounds if r["at"] <= fault["at"]]
    if not before:
        return 0
    last = before[-1]
    planned = last.get("planned") or []
    return sum(planned[i] for i, member in enumerate(last["members"])
               if f"-{launcher}-" in member and i < len(planned))


def run_restarted(cfg: ScheduleBenchConfig, spec, train: list[str], run_dir: Path, schedule: Schedule | None,
                  local_steps: int, reached: threading.Event | None = None) -> dict:
    """`scalesgd testbed run -- scalesgd train`, launched again from the last checkpoint (`--resume`) each time it
    fails, as torchrun's --max-restarts would (from the start where no checkpoint was written yet)."""
    attempt_dir = run_dir / "run"
    base = [sys.executable, "-m", "scalesgd", "testbed", "run", "--prefix", spec.prefix, "--", "scalesgd", "train"]
    restarts, code = 0, 0
    finished, deadline = threading.Event(), time.monotonic() + cfg.limit_s

    with Watcher([attempt_dir / METRICS_NAME], local_steps) as watcher, \
            (Injector(spec, schedule, lambda: not finished.is_set()) if schedule else contextlib.nullcontext()):
        argv = [*train, "--run-dir", str(attempt_dir)]
        while True:
            proc = subprocess.Popen([*base, *argv])
            code = finish(proc, deadline, reached)
            if code in (0, 2, LIMITED, REACHED) or (attempt_dir / SUMMARY_NAME).exists() or restarts >= cfg.max_restarts:
                break  # done (a fault after its last step failed the launch, not the run), or bad input
            restarts += 1
            watcher.read()
            if (attempt_dir / CHECKPOINT_NAME).exists():
                argv = ["--resume", str(attempt_dir), "--quiet"]
                start = max((r["iter"] for r in metrics.read(attempt_dir / METRICS_NAME) if r["kind"] == "epoch"),
                            default=0)
            else:
                shutil.rmtree(attempt_dir, ignore_errors=True)
                argv, start = [*train, "--run-dir", str(attempt_dir)], 0
            watcher.start_attempt(start)
        finished.set()
    said = json.loads((attempt_dir / SUMMARY_NAME).read_text()) if (attempt_dir / SUMMARY_NAME).exists() else {}
    steps = said.get("steps_per_epoch", 0) * said.get("epochs", 0)
    computed = watcher.computed()
    return {"code": code, "dirs": [attempt_dir], "boundaries": watcher.boundaries,
            "goodput": min(1.0, steps / computed) if computed and steps else None, "committed_steps": steps,
            "computed_steps": computed, "restarts": restarts, "evaluations": list(watcher.evaluations.values())}

