"""`bench elastic`'s reading of a run: the spread it prints, and the seconds it takes from the members' logs; `bench
elastic-train`'s slow worker."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalesgd.bench.elastic import outcome, spread
from scalesgd.bench.elastic.injector import cpu_quota


def test_the_spread_is_the_median_with_min_and_max_and_a_dash_for_nothing():
    assert spread([3.0, 1.0, 2.0]) == "2.00 (1.00–3.00)"
    assert spread([None, 4.0]) == "4.00"
    assert spread([None]) == "—"


def _entry(at, members, retries=0, seconds=0.04, digest="d"):
    return {"at": at, "members": members, "retries": retries, "seconds": seconds, "digest": digest}


def test_the_seconds_are_to_the_first_round_without_the_faulty_worker_and_back_with_it():
    three, two = ["w0-a", "w1-b", "w2-c"], ["w0-a", "w1-b"]
    log = [_entry(10.0, three), _entry(10.5, three), _entry(11.7, two, retries=1, seconds=1.2),
           _entry(13.0, two), _entry(14.4, ["w0-a", "w1-b", "w2-d"])]
    logs = {"w0": {"log": log, "rounds": 5, "digest": "x"}, "w1": {"log": log, "rounds": 5, "digest": "x"}}
    result = outcome("stop", 0, logs, fault=10.4, back=14.0, faulty="w2")
    assert round(result.to_round_s, 6) == 1.3 and round(result.back_s, 6) == 0.4
    assert (result.rounds, result.retries, result.round_s, result.equal) == (5, 1, 0.04, True)
    logs["w1"] = {**logs["w1"], "digest": "y"}
    assert not outcome("stop", 0, logs, 10.4, 14.0, "w2").equal


def test_a_cpu_quota_holds_a_busy_process_to_its_share_and_its_group_is_removed():
    """`bench elastic-train`'s slow worker: a cgroup's quota, where this machine lets us write one."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with cpu_quota(busy.pid, 0.25) as held:
            if not held:
                pytest.skip("cgroups cannot be written here (the bench stops the worker by signals instead)")
            groups = [line for line in Path(f"/proc/{busy.pid}/cgroup").read_text().splitlines()
                      if "scalesgd-slow-" in line]
            before, start = cpu_seconds(busy.pid), time.monotonic()
            time.sleep(1.0)
            used = (cpu_seconds(busy.pid) - before) / (time.monotonic() - start)
        assert groups and 0.15 < used < 0.35, used  # a quarter of a core, not the whole one it would take
        assert "scalesgd-slow-" not in Path(f"/proc/{busy.pid}/cgroup").read_text()
    finally:
        busy.kill()
        busy.wait()


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of `pid` so far (/proc/PID/stat's utime and stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
