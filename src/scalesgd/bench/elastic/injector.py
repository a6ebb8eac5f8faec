"""A fixed failure schedule on the testbed: every `every` seconds, the next fault in turn on the next node after
node 0 (which hosts the run's coordinator) — its worker SIGKILLed, the node frozen (every process in it SIGSTOPped)
for `down_s`, or its link pulled at the switch for `down_s` — each fault logged with its wall time. And a straggler:
one node's worker held to a fraction of a core all run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalesgd.bench.elastic.background import OnThread
from scalesgd.runtime.forked import NAME_PREFIX
from scalesgd.testbed import netns
from scalesgd.testbed.spec import TestbedSpec

FAULTS = ("kill", "stop", "link")


@dataclass
class Schedule:
    """When and what: the first fault `every` s after the start, then one each `every` s."""

    every: float = 30.0
    down_s: float = 20.0
    kinds: tuple[str, ...] = FAULTS
    log: list[dict] = field(default_factory=list)

    def plan(self, number: int, nodes: int) -> tuple[str, int]:
        """The `number`-th fault's kind and node (nodes 1 … nodes-1 in turn)."""
        return self.kinds[number % len(self.kinds)], 1 + number % (nodes - 1)


def pids_in(spec: TestbedSpec, node: int) -> list[int]:
    """Every process running in the node's network namespace."""
    said = subprocess.run(["ip", "netns", "pids", spec.node(node)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in said.split()]


def worker_of(spec: TestbedSpec, node: int) -> int | None:
    """The training worker on `node`, not its launcher: a worker our launcher forked (named scalesgd-r<rank>, as an
    elastic launch's is), else one started as `python -m scalesgd train` by torchrun's environment; the newest."""
    forked, started = [], []
    for pid in pids_in(spec, node):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().startswith(NAME_PREFIX):
                forked.append(pid)
                continue
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"scalesgd" in argv and b"train" in argv and b"--join" not in argv:
                started.append(pid)
    found = forked or started
    return max(found) if found else None


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def inject(spec: TestbedSpec, schedule: Schedule, number: int, alive) -> None:
    """The `number`-th fault, held for its `down_s` where it has one; logged at the moment it struck."""
    kind, node = schedule.plan(number, spec.nodes)
    entry = {"fault": kind, "node": node, "at": time.time()}
    if kind == "kill":
        victim = worker_of(spec, node)
        while victim is None and alive():  # not started yet (or restarting): the kill strikes once it is
            time.sleep(0.05)
            victim = worker_of(spec, node)
        entry["at"] = time.time()
        if victim is not None:  # else the run ended first: no fault
            signal_all([victim], signal.SIGKILL)
            schedule.log.append({**entry, "pid": victim})
        return
    schedule.log.append(entry)
    frozen = pids_in(spec, node) if kind == "stop" else []
    try:
        if kind == "stop":
            signal_all(frozen, signal.SIGSTOP)
        else:
            netns.set_link(spec, node, up=False)
        deadline = time.monotonic() + schedule.down_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if kind == "stop":
            signal_all(frozen, signal.SIGCONT)
        else:
            netns.set_link(spec, node, up=True)
        entry["back"] = time.time()


class Injector(OnThread):
    """The schedule run on a thread of its own for as long as `alive()` holds; every fault undone on the way out."""

    name = "fault-injector"

    def __init__(self, spec: TestbedSpec, schedule: Schedule, alive):
        super().__init__()
        self.spec, self.schedule, self.alive = spec, schedule, alive

    def __enter__(self) -> Injector:
        self._start = time.monotonic()
        return super().__enter__()

    def _run(self) -> None:
        number = 0
        while True:
            due = self._start + (number + 1) * self.schedule.every
            if self._stop.wait(max(0.0, due - time.monotonic())) or not self.alive():
                return
            inject(self.spec, self.schedule, number, lambda: self.alive() and not self._stop.is_set())
            number += 1


class Slowed(OnThread):
    """Node `node`'s worker held to `cores` of CPU time from the moment it starts until the way out (a cgroup's
    quota; `held` says whether one could be written here)."""

    name = "straggler"

    def __init__(self, spec: TestbedSpec, node: int, cores: float):
        super().__init__()
        self.spec, self.node, self.cores = spec, node, cores
        self.held, self.ready = False, threading.Event()  # ready: the quota tried on the worker

    def _run(self) -> None:
        victim = None
        while victim is None and not self._stop.wait(0.05):
            victim = worker_of(self.spec, self.node)
        if victim is None:
            return
        with cpu_quota(victim, self.cores) as self.held:
            self.ready.set()
            self._stop.wait()


@contextlib.contextmanager
def cpu_quota(pid: int, cores: float):
    """`pid` held to `cores` of CPU time (a cgroup v1 or v2 CPU quota over 10 ms periods) while inside; yields
    whether it is (False where cgroups cannot be written here). The group is removed on the way out."""
    period = 10_000
    quota = max(1000, int(cores * period))
    for root, marker, limits in (
            (Path("/sys/fs/cgroup/cpu"), "cpu.cfs_quota_us", {"cpu.cfs_period_us": period, "cpu.cfs_quota_us": quota}),
            (Path("/sys/fs/cgroup"), "cgroup.controllers", {"cpu.max": f"{quota} {period}"})):
        if not (root / marker).exists():  # not that hierarchy here (a folder made in a tmpfs would limit nothing)
            continue
        group = root / f"scalesgd-slow-{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            for name, value in limits.items():
                (group / name).write_text(str(value))
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:
            group.rmdir()
            continue
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):  # the process gone, the group empties: it can go
                (root / "cgroup.procs").write_text(str(pid))
            with contextlib.suppress(OSError):
                group.rmdir()
        return
    yield False
