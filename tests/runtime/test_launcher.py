"""The local launcher's supervision: which failure is reported, and the failed worker's own exit status."""

import os
import subprocess
import sys
import time

from scalesgd.errors import EXIT_NON_FINITE, EXIT_PEER_LOST, EXIT_USAGE
from scalesgd.runtime.heartbeat import HEARTBEAT_FILE, Heartbeats
from scalesgd.runtime.launcher import supervise, worker_env


def fake_workers(*scripts):
    return [subprocess.Popen([sys.executable, "-c", s]) for s in scripts]


def test_all_zero_is_success():
    assert supervise(fake_workers("pass", "pass"), timeout_s=10) == 0


def test_names_the_rank_that_failed_first_not_the_peers_that_lost_it(capsys):
    read, write = os.pipe()  # rank 1 holds the only write end: rank 0 reads end-of-file once rank 1 is gone
    lose_peer = f"import os; os.read({read}, 1); raise SystemExit({EXIT_PEER_LOST})"
    lost = subprocess.Popen([sys.executable, "-c", lose_peer], pass_fds=[read])
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                              pass_fds=[write])
    os.close(read)
    os.close(write)
    assert killed.wait(timeout=30) == -9 and lost.wait(timeout=30) == EXIT_PEER_LOST
    # both ended before supervise's first poll, which takes the ranks in order: it sees rank 0's failure first
    assert supervise([lost, killed], timeout_s=10) == 128 + 9  # the worker's own status, as a shell reports a signal
    assert capsys.readouterr().err == ("scalesgd: error: worker rank 1 was killed by SIGKILL; "
                                       "the other workers were stopped\n")


def test_a_hung_peer_is_killed_after_the_timeout(capsys):
    procs = fake_workers("import time; time.sleep(600)", "raise SystemExit(7)")
    start = time.monotonic()
    assert supervise(procs, timeout_s=1) == 7  # the failed worker's own status
    assert time.monotonic() - start < 10
    assert procs[0].returncode is not None
    assert "worker rank 1 exited with status 7" in capsys.readouterr().err


def test_bad_input_and_divergence_keep_their_own_status_and_message(capsys):
    assert supervise(fake_workers(f"raise SystemExit({EXIT_USAGE})", "pass"), timeout_s=5) == EXIT_USAGE
    assert supervise(fake_workers(f"raise SystemExit({EXIT_NON_FINITE})", f"raise SystemExit({EXIT_NON_FINITE})"),
                     timeout_s=5) == EXIT_NON_FINITE
    assert capsys.readouterr().err == ""  # rank 0 itself already printed the one line


def test_worker_environment_matches_torchrun_and_binds_loopback():
    env = worker_env(1, 4, "127.0.0.1", 29500)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "4", "1", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")
    assert env["GLOO_SOCKET_IFNAME"] == "lo"


def noting(beats: Heartbeats, rank: int, line: str, code: int, wait_fd: int | None = None) -> str:
    """A fake worker that beats as ours do, leaves `line` for the launcher and exits with `code` (after `wait_fd`
    reads end-of-file: its peer is gone)."""
    wait = f"os.read({wait_fd}, 1); " if wait_fd is not None else ""
    return (f"import os; from scalesgd.runtime import heartbeat; {wait}"
            f"heartbeat.beat_in_background({{{HEARTBEAT_FILE!r}: {str(beats.files[rank])!r}}}); "
            f"heartbeat.leave_note({line!r}); raise SystemExit({code})")


def test_a_cause_several_workers_met_is_said_once_with_their_status(capsys):
    beats = Heartbeats(2)
    try:
        procs = fake_workers(*(noting(beats, r, "/data is gone (removed or renamed while the run read it)",
                                      EXIT_USAGE) for r in (0, 1)))
        assert supervise(procs, timeout_s=5, heartbeats=beats) == EXIT_USAGE
    finally:
        beats.close()
    assert capsys.readouterr().err == ("scalesgd: error: /data is gone (removed or renamed while the run read it); "
                                       "the other workers were stopped\n")


def test_the_rank_that_named_its_cause_is_reported_not_the_first_to_lose_its_peer(capsys):
    beats = Heartbeats(2)
    read, write = os.pipe()  # rank 0 holds the only write end: rank 1 leaves its line once rank 0 has failed
    try:
        lost = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({EXIT_PEER_LOST})"], pass_fds=[write])
        cut_off = subprocess.Popen([sys.executable, "-c", noting(beats, 1, "worker rank 1 is unreachable: its "
                                                                 "network link eth0 is down", EXIT_PEER_LOST, read)],
                                   pass_fds=[read])
        os.close(read)
        os.close(write)
        assert supervise([lost, cut_off], timeout_s=10, heartbeats=beats) == EXIT_PEER_LOST
    finally:
        beats.close()
    assert capsys.readouterr().err == ("scalesgd: error: worker rank 1 is unreachable: its network link eth0 is "
                                       "down; the other workers were stopped\n")
