"""torchft's DiLoCo with its fault tolerance on, a replica group a process and the lighthouse apart (as `bench
elastic-schedule`'s torchft mode runs it): the others go on without a replica killed mid-run; one started again
heals from a peer, and every replica ends with the same global state by hash."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalesgd.bench.elastic.torchft_schedule import goodput
from scalesgd.train import metrics
from tests.train.cli import FAST

pytest.importorskip("torchft")

TRAIN = [*FAST, "--local-steps", "4", "--samples", "1536", "--peer", "torchft", "--codec", "fp32"]


def rounds(run: Path) -> list[dict]:
    return [r for r in metrics.read(run / "metrics.jsonl") if r["kind"] == "round"]


def replica(i: int, replicas: int, lighthouse: str, run: Path, epochs: int, bucket_mb: float = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scalesgd.bench.elastic.torchft_replica", "--replica", str(i),
                             "--replicas", str(replicas), "--lighthouse", lighthouse, "--run-dir", str(run), "--",
                             *TRAIN, "--epochs", str(epochs), "--peer-bucket-mb", str(bucket_mb)],
                            stderr=subprocess.PIPE, text=True)


def wait_for(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def lighthouse(request):
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=request.param, join_timeout_ms=10000,
                              heartbeat_timeout_ms=1000)
    yield server.address()
    server.shutdown()


@pytest.mark.parametrize("lighthouse", [1], indirect=True)
def test_the_others_go_on_without_a_killed_replica(tmp_path, lighthouse):
    """In torchft's buckets (`--peer-bucket-mb`; the next test sends a tensor an allreduce)."""
    runs = [tmp_path / f"r{i}" for i in range(2)]
    procs = [replica(i, 2, lighthouse, runs[i], epochs=4, bucket_mb=1.0) for i in range(2)]  # rounds left after the kill, even
    wait_for(lambda: any(r["committed"] for r in rounds(runs[1])), "replica 1's first round")  # on a loaded machine
    procs[1].send_signal(signal.SIGKILL)
    assert procs[0].wait(60) == 0, procs[0].stderr.read()[-2000:]
    mine = rounds(runs[0])
    assert [r["members"] for r in mine if r["committed"]][-1] == 1  # its last rounds alone
    assert mine[-1]["round"] + 1 == 4 * 12 // 4  # and every round of the run taken
    procs[1].wait()


@pytest.mark.parametrize("lighthouse", [3], indirect=True)
def test_a_replica_started_again_heals_and_ends_equal_to_the_others(tmp_path, lighthouse):
    """A quorum of 3 needed: the two left wait for the killed one's replacement, which heals from a peer."""
    runs = [tmp_path / f"r{i}" for i in range(3)]
    procs = [replica(i, 3, lighthouse, runs[i], epochs=2) for i in range(3)]
    wait_for(lambda: any(r["committed"] for r in rounds(runs[2])), "replica 2's first round")
    procs[2].send_signal(signal.SIGKILL)
    procs[2].wait()
    procs[2] = replica(2, 3, lighthouse, runs[2], epochs=2)
    for proc in procs:
        assert proc.wait(60) == 0, proc.stderr.read()[-2000:]
    logs = [rounds(run) for run in runs]
    assert any(r["healed"] for r in logs[2]) and not any(r["healed"] for r in logs[0] + logs[1])
    last = [[r for r in log if r["committed"]][-1] for log in logs]
    assert len({(r["round"], r["digest"]) for r in last}) == 1  # the same round, the same global state
    assert all(r["members"] == 3 for log in logs for r in log if r["committed"])


def test_goodput_counts_a_discarded_round_for_every_replica_and_a_healed_one_as_lost():
    def log(*rounds):
        return [{"kind": "round", "steps": 4, "committed": c, "healed": h} for c, h in rounds]

    logs = [log((True, False), (False, False), (True, False)),  # a round discarded by all
            log((True, False), (False, False), (True, False)),
            log((True, False), (False, False), (True, True))]  # then healed: a peer's state replaced its work
    figures = goodput(logs, kills=1, local_steps=4)  # and a kill: its round counted whole
    assert figures["committed_steps"] == 5 * 4 and figures["computed_steps"] == 9 * 4 + 4
    assert figures["goodput"] == pytest.approx(20 / 40)


def test_a_replica_outside_the_groups_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "scalesgd.bench.elastic.torchft_replica", "--replica", "2",
                           "--replicas", "2", "--lighthouse", "http://127.0.0.1:1", "--run-dir", "unused", "--",
                           *TRAIN], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--replica 2" in done.stderr
