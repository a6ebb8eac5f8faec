"""A stopped worker ends the run within the timeout and a few seconds, and is the rank the message names."""

import os
import signal
import subprocess
import sys
import time

from scalesgd.bench.faults import rank_of, workers_of
from scalesgd.runtime.heartbeat import Heartbeats
from tests.train.cli import wait_for_checkpoint

TIMEOUT_S = 5


def test_a_stopped_worker_is_named_and_the_run_ends_within_the_timeout(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(run), "--workers", "3",
                             "--batch-size", "96", "--epochs", "200", "--warmup-epochs", "1", "--quiet",
                             "--timeout", str(TIMEOUT_S)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoint(run, proc)
        victim = next(pid for pid in workers_of(proc) if rank_of(pid) == 1)
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - stopped_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert took < TIMEOUT_S + 10
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scalesgd: error: worker rank 1 stopped responding"), err


def test_silence_is_counted_from_the_last_beat():
    beats = Heartbeats(2)
    try:
        old = time.time() - 60
        os.utime(beats.files[1], (old, old))
        silent = beats.silent([0, 1])
        assert [rank for rank, _ in silent] == [1] and silent[0][1] >= 60
        assert beats.silent([0]) == []
    finally:
        beats.close()
    assert not beats.dir.exists()


def test_a_worker_still_starting_has_the_start_up_grace_before_its_first_beat():
    beats = Heartbeats(2)
    try:
        assert beats.silent([0, 1], longer_than_s=0.0) == []  # importing torch on a loaded machine takes seconds
        first_beat = time.time() - 2.0
        os.utime(beats.files[1], (first_beat, first_beat))  # rank 1 beat first 2 s ago: no grace after that
        silent = beats.silent([0, 1], longer_than_s=1.0)
        assert [rank for rank, _ in silent] == [1] and 1.99 < silent[0][1] < 12  # counted from that beat
        assert [rank for rank, _ in beats.silent([0, 1], longer_than_s=0.0)] == [1]  # rank 0 is still in its grace
    finally:
        beats.close()
