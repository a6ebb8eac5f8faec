"""A launcher sent SIGTERM or SIGHUP stops every worker; a launcher that dies takes its workers with it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalesgd.bench.faults import alive, workers_of
from tests.train.cli import wait_for_checkpoint

TRAIN = ["--workers", "2", "--batch-size", "64", "--epochs", "200", "--warmup-epochs", "1", "--quiet",
         "--timeout", "30", "--model", "resnet8", "--checkpoint-every", "2"]  # a checkpoint two steps in


def _until(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _gone_within(pids: list[int], seconds: float) -> bool:
    return _until(lambda: not any(alive(p) for p in pids), seconds)


def _running_in_session(session: int) -> list[int]:
    """The processes of `session` still running (a zombie writes nothing)."""
    running = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:  # /proc/PID/stat: "pid (comm) state ppid pgrp session …"; comm may hold spaces and parentheses
            state, _, _, sid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):  # not a process, or one that has just gone
            continue
        if int(sid) == session and state != "Z":
            running.append(int(entry.name))
    return running


def _start(run: Path) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(run), *TRAIN],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(run, proc)
    return proc, workers_of(proc)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_launcher_stops_every_worker_with_one_line(tmp_path, sig):
    proc, workers = _start(tmp_path / "run")
    try:
        assert len(workers) == 2
        proc.send_signal(sig)
        proc.wait(30)
        exited = time.monotonic()
        err = proc.stderr.read()  # to its end: nothing the launcher started holds its output open after it
        assert time.monotonic() - exited < 1.0
        assert proc.returncode == 128 + sig
        assert err.strip().splitlines() == [f"scalesgd: stopped by {sig.name}; the workers were stopped"]
        assert _gone_within(workers, 5)
        # nobody writes to the run any more: nothing the launcher started (workers, anything they started) still runs
        assert _until(lambda: not _running_in_session(proc.pid), 5), _running_in_session(proc.pid)
    finally:
        if proc.poll() is None or _running_in_session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_workers_die_with_their_launcher(tmp_path):
    proc, workers = _start(tmp_path / "run")
    try:
        proc.kill()  # SIGKILL: the launcher cannot stop anyone
        proc.wait()
        assert _gone_within(workers, 5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def test_a_worker_whose_launcher_is_gone_ends_at_once():
    env = dict(os.environ, SCALESGD_LAUNCHER_PID=str(2 ** 22 + 1))  # above pid_max: no such process
    proc = subprocess.run([sys.executable, "-c", "from scalesgd.runtime.launcher import die_with_parent;"
                           "die_with_parent(); print('trained on')"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "trained on" not in proc.stdout


def test_a_failure_to_start_workers_stops_the_ones_started(capsys):
    from scalesgd.runtime.launcher import launch
    sleeper = ([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), None)
    missing = (["/nonexistent/python"], dict(os.environ), None)
    start = time.monotonic()
    assert launch([sleeper, missing], timeout_s=30) == 1
    assert time.monotonic() - start < 10
    assert capsys.readouterr().err.startswith("scalesgd: error: could not start worker 1 of 2")
