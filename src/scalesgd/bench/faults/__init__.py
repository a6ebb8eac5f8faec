"""`scalesgd bench faults`: what a training run does when it is hurt — workers killed or stopped, the launcher sent
a signal or killed, the run directory torn, many kills in one run, a data loader process killed, the image folder
removed, the disk filled under a checkpoint, a node's link taken down — timed from the fault to the end, each with
whether the outcome was the one promised (and, where it stopped, whether its checkpoint resumed to the end)."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scalesgd import checks, output
from scalesgd.bench.faults.paths import data_deleted, data_renamed, disk_full, kill_loader, link_down, link_flap
from scalesgd.bench.faults.process import kill_launcher, kill_worker, signal_launcher, soak, stop_worker, torn_run_dir
from scalesgd.bench.faults.runs import SKIPPED, Outcome, _until, alive, loader_of, rank_of, workers_of
from scalesgd.options import Options, option, words

# what other modules and the tests read from here: the command, its table, and the pieces that find a run's processes
__all__ = ["SCENARIOS", "FaultsBenchConfig", "Outcome", "_until", "alive", "clean", "loader_of", "promised", "rank_of",
           "run", "workers_of"]


@dataclass
class FaultsBenchConfig(Options):
    """`scalesgd bench faults`: inject each fault into a short `scalesgd train` run; time to exit and outcome."""

    scenarios: tuple[str, ...] = option(("kill-worker", "sigterm", "sighup", "kill-launcher", "stop-worker",
                                         "torn-run-dir", "soak", "kill-loader", "data-renamed", "data-deleted",
                                         "disk-full", "link-flap", "link-down"),
                                        "which faults (disk-full, link-flap and link-down need root)", parse=words,
                                        choices=lambda: SCENARIOS, check=checks.distinct)
    workers: int = option(3, "workers of each run", check=checks.within(2, 8))
    kills: int = option(5, "kills of a random rank at random moments in the soak (which restarts each time)",
                        check=checks.within(1, 100))
    timeout: float = option(10.0, "each run's --timeout: a stopped worker must be named within it and 10 s",
                            check=checks.within(1, 300))
    seed: int = option(0, "which moments and ranks the soak kills", check=checks.seed)
    out: str = option("", "output directory", shown_default="runs/bench/faults-<timestamp>", check=checks.output_dir)


def run(cfg: FaultsBenchConfig, command: str) -> int:
    """Every scenario in turn, each in a directory of its own under `out`; the table, and status 1 if any failed."""
    out = Path(cfg.out)
    results = [SCENARIOS[name](cfg, out / name) for name in cfg.scenarios]
    columns = ["scenario", "fault", "seconds to the end", "outcome", "as promised"]
    rows = [[r.scenario, r.fault, f"{r.seconds:.1f}", r.outcome, promised(r)] for r in results]
    output.write(out, "faults", {"config": cfg.to_dict(), "results": [r.__dict__ for r in results]}, columns, rows,
                 command)
    output.console().print(output.rich_table("faults", columns, rows))
    if all(r.ok for r in results):
        clean(out)  # the runs are kept only where something went wrong, to look into
        return 0
    return 1


def promised(result: Outcome) -> str:
    if result.outcome.startswith(SKIPPED):
        return "skipped"
    return "yes" if result.ok else "**no**"


SCENARIOS: dict[str, Callable[[FaultsBenchConfig, Path], Outcome]] = {
    "kill-worker": kill_worker, "sigterm": signal_launcher(signal.SIGTERM), "sighup": signal_launcher(signal.SIGHUP),
    "kill-launcher": kill_launcher, "stop-worker": stop_worker, "torn-run-dir": torn_run_dir, "soak": soak,
    "kill-loader": kill_loader, "data-renamed": data_renamed, "data-deleted": data_deleted, "disk-full": disk_full,
    "link-flap": link_flap, "link-down": link_down,
}


def clean(out: Path) -> None:
    """Remove the scenarios' run directories, keeping faults.json and faults.md."""
    for child in out.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
