"""`scalesgd bench elastic`: DiLoCo among whoever is alive, on local workers joined through a coordinator (torchft's
lighthouse and a store), with one fault a run — a worker killed between rounds or inside the reduce, stopped
between rounds or inside the reduce (and resumed), a new worker joining — timed from the fault to the survivors'
next committed round, and from a worker's return to the first round it is in again; every finishing member's global
state compared by hash."""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from scalesgd import checks, output
from scalesgd.bench import quality_report
from scalesgd.bench.elastic import worker
from scalesgd.elastic import Coordinator
from scalesgd.elastic.coordinator import HEARTBEAT_S
from scalesgd.options import Options, option, words

SCENARIOS = ("none", "kill", "kill-in-reduce", "stop", "stop-in-reduce", "join")
CONTEXT = multiprocessing.get_context("forkserver")


@dataclass
class ElasticBenchConfig(Options):
    """`scalesgd bench elastic`: faults injected into DiLoCo rounds among whoever is alive; seconds to the next
    round."""

    scenarios: tuple[str, ...] = option(SCENARIOS, "which faults, one a run", parse=words, choices=lambda: SCENARIOS,
                                        check=checks.distinct)
    workers: int = option(4, "workers each run starts with", check=checks.within(2, 8))
    runs: int = option(3, "runs of each scenario", check=checks.within(1, 20))
    rounds: int = option(200, "rounds of 4 inner steps each run trains", check=checks.within(20, 100000))
    stop_s: float = option(3.0, "seconds a stopped worker stays stopped", check=checks.within(0.1, 600))
    out: str = option("", "output directory", shown_default="runs/bench/elastic-<timestamp>", check=checks.output_dir)


@dataclass
class Outcome:
    """One run: seconds from the fault to the survivors' first round without the faulty worker (`to_round_s`), from
    the worker's return (its
    SIGCONT, or a joiner's start) to the first round it is in (`back_s`), rounds committed and retried, the median
    seconds of a round without a fault, and whether every finishing member holds the same global state."""

    scenario: str
    run: int
    to_round_s: float | None
    back_s: float | None
    rounds: int
    retries: int
    round_s: float
    equal: bool


def run(cfg: ElasticBenchConfig, command: str) -> int:
    """Every scenario × run in turn; the table (medians, min–max), and status 1 where a run's members differ."""
    out = Path(cfg.out)
    results = [one_run(cfg, scenario, r) for scenario in cfg.scenarios for r in range(cfg.runs)]
    columns = ["scenario", "fault → next round, s", "back → in a round, s", "rounds", "retries", "round, ms",
               "states equal"]
    rows = [row(scenario, [r for r in results if r.scenario == scenario]) for scenario in cfg.scenarios]
    output.write(out, "elastic", {"config": cfg.to_dict(), "results": [r.__dict__ for r in results]}, columns, rows,
                 command)
    output.console().print(output.rich_table("elastic rounds under faults", columns, rows))
    return 0 if all(r.equal for r in results) else 1


def row(scenario: str, runs: list[Outcome]) -> list:
    return [scenario, spread([r.to_round_s for r in runs]), spread([r.back_s for r in runs]),
            spread([r.rounds for r in runs], "{:.0f}"), spread([r.retries for r in runs], "{:.0f}"),
            spread([1000 * r.round_s for r in runs], "{:.1f}"), "yes" if all(r.equal for r in runs) else "**no**"]


def spread(values: list, form: str = "{:.2f}") -> str:
    """The median (min–max) of what was measured (None: not in that run), or — where nothing was."""
    return quality_report.spread([v for v in values if v is not None], form)


def one_run(cfg: ElasticBenchConfig, scenario: str, number: int) -> Outcome:
    """Start the workers (the last one faulty), inject the scenario's fault a quarter into the run, wait for every
    worker, and read what they logged."""
    n, steps, quarter = cfg.workers, cfg.rounds * worker.H, cfg.rounds // 4
    faulty = f"w{n - 1}"
    plan = {"kill": {"kill": quarter * worker.H + 2}, "kill-in-reduce": {"kill_in_reduce": quarter},
            "stop": {"stop": quarter * worker.H + 2}, "stop-in-reduce": {"stop_in_reduce": quarter}}.get(scenario, {})
    with Coordinator(min_workers=1) as coordinator, tempfile.TemporaryDirectory() as folder:
        def start(name: str, faults: dict, first: int) -> multiprocessing.Process:
            process = CONTEXT.Process(target=worker.run, name=name, args=(
                name, str(coordinator.address), folder, steps, faults, "fp8", first, 64, HEARTBEAT_S))
            process.start()
            return process

        starters = n - 1 if scenario == "join" else n
        faults = {f"w{i}": {} for i in range(starters)}
        if scenario == "join":  # the others wait for it a quarter into the run (torchft's barrier_at)
            faults = {name: {"await_at": (quarter * worker.H + 2, "joiner")} for name in faults}
        else:
            faults[faulty] = plan
        processes = [start(name, planned, starters) for name, planned in faults.items()]
        back = None
        if scenario == "join":
            coordinator.store.wait([f"progress/w0/{quarter}"])
            processes.append(start(faulty, {"announce": "joiner"}, starters))
            coordinator.store.wait(["joiner"])
            back = time.time()
        elif scenario.startswith("stop"):
            coordinator.store.wait([f"fault/{faulty}"])
            time.sleep(cfg.stop_s)  # the fault itself: stopped this long
            os.kill(processes[-1].pid, signal.SIGCONT)
            back = time.time()
        for process in processes:
            process.join(timeout=600)
        fault = (float(coordinator.store.get(f"fault/{faulty}").decode())
                 if coordinator.store.check([f"fault/{faulty}"]) else None)
        logs = {p.name: torch.load(Path(folder) / f"{p.name}.pt", weights_only=False)
                for p in processes if p.exitcode == 0}
    return outcome(scenario, number, logs, fault, back, faulty)


def outcome(scenario: str, number: int, logs: dict, fault: float | None, back: float | None,
            faulty: str) -> Outcome:
    """What the first worker's log says of the run (it is never the faulty one)."""
    log = logs["w0"]["log"]
    after = [entry["at"] for entry in log if fault is not None and entry["at"] > fault
             and not any(member.startswith(f"{faulty}-") for member in entry["members"])]
    returned = [entry["at"] for entry in log if back is not None and entry["at"] > back
                and any(member.startswith(f"{faulty}-") for member in entry["members"])]
    calm = [entry["seconds"] for entry in log if entry["retries"] == 0]
    return Outcome(scenario, number, after[0] - fault if after else None, returned[0] - back if returned else None,
                   logs["w0"]["rounds"], sum(entry["retries"] for entry in log), statistics.median(calm),
                   len({r["digest"] for r in logs.values()}) == 1)
