"""What every run of `bench elastic-schedule` does with its launches on the testbed's nodes: the environment a
node's worker gets, a launch stopped at the run's limit, and what the runs' metrics files and summaries say."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from scalesgd.bench.elastic.background import OnThread
from scalesgd.errors import UsageError
from scalesgd.runtime.launcher import local_settings
from scalesgd.runtime.link import NODE_DEVICE, TESTBED_VARIABLE
from scalesgd.train import metrics
from scalesgd.train.rundir import METRICS_NAME, SUMMARY_NAME

LIMITED = -1000  # the exit status recorded for a launch stopped at --limit-s
REACHED = -1001  # … for one stopped once the run reached its target (--until-target)
POLL_S = 0.5


def finish(proc: subprocess.Popen, deadline: float, reached: threading.Event | None = None, stacks=None) -> int:
    """The launch's exit status, or LIMITED where it was still going at `deadline`, REACHED where `reached` was set
    first (then stopped: SIGTERM, which our launchers pass on to their workers). `stacks()`: the process asked for
    its threads' stacks (SIGUSR1) before a launch is stopped at `deadline`: where a run hangs."""
    while True:
        try:
            return proc.wait(max(0.0, min(POLL_S, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if reached is not None and reached.is_set():
                break
            if time.monotonic() >= deadline:
                if stacks is not None and (pid := stacks()) is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR1)
                    time.sleep(1.0)
                break
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return REACHED if reached is not None and reached.is_set() else LIMITED


class TargetWatch(OnThread):
    """`reached` is set once a metrics file under `folder` holds an evaluation at or below `target` (read every
    POLL_S on a thread of its own while inside)."""

    name = "target-watch"

    def __init__(self, folder: Path, target: float):
        super().__init__()
        self.folder, self.target, self.reached = folder, target, threading.Event()

    def _run(self) -> None:
        while not self.reached.is_set() and not self._stop.wait(POLL_S):
            for path in self.folder.glob(f"**/{METRICS_NAME}"):
                try:
                    records = metrics.read(path)
                except (UsageError, OSError):  # replaced under it, or half-written: read it next time
                    continue
                if any(r.get("test_loss") is not None and r["test_loss"] <= self.target for r in records):
                    self.reached.set()


def summary_of(dirs: list[Path]) -> dict:
    """The summary the run's last writer wrote ({} where none did: a run stopped at its limit)."""
    summaries = [d / SUMMARY_NAME for d in dirs if (d / SUMMARY_NAME).exists()]
    newest = max(summaries, key=lambda p: p.stat().st_mtime, default=None)
    return json.loads(newest.read_text()) if newest else {}


def sent_by(dirs: list[Path]) -> float | None:
    """MB the run's last writer sent (its summary; every worker sends alike in an allreduce)."""
    said = summary_of(dirs)
    return said["bytes_sent"] / 1e6 if said else None


def records_of(dirs: list[Path]) -> list[dict]:
    """Every record of the runs' metrics files (an elastic run's writer moves from node to node), once each."""
    seen, out = set(), []
    for folder in dirs:
        for record in metrics.read(folder / METRICS_NAME):
            key = json.dumps(record, sort_keys=True)
            if key not in seen and "at" in record:
                seen.add(key)
                out.append(record)
    return out


def node_env(spec, node: int) -> dict:
    """What a worker on a testbed node needs, as `testbed run` gives it: gloo on the node's link, its share of the
    cores, the testbed named."""
    return local_settings({**os.environ, TESTBED_VARIABLE: spec.prefix}, spec.world_size, spec.address(node),
                          NODE_DEVICE)

