"""`scalesgd train --local-steps H --elastic`: rounds among whoever is alive on the command line — a worker killed
mid-run is restarted alone by the launcher and rejoins while the others go on, and bad input on the new options ends
in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from scalesgd.bench.elastic.train import half_speed, records
from scalesgd.elastic.outcomes import DivergedError
from scalesgd.runtime.forked import worker_pid
from scalesgd.train.elastic import ended_alike
from tests.train.cli import scalesgd

pytest.importorskip("torchft")

ELASTIC = ["train", "--quiet", "--dataset", "digits", "--model", "resnet8", "--batch-size", "96", "--warmup", "none",
           "--local-steps", "4", "--codec", "fp16", "--elastic"]  # fp16: no kernels to build


def rounds(run: Path) -> list[dict]:
    return records(run, "round")


def test_a_killed_worker_is_restarted_alone_and_rejoins_while_the_others_go_on(tmp_path):
    host_run, join_run = tmp_path / "host", tmp_path / "join"  # two workers hosting, one joining from a launch of
    host = subprocess.Popen([sys.executable, "-m", "scalesgd", *ELASTIC, "--workers", "2", "--epochs", "10",  # its own
                             "--max-restarts", "1", "--run-dir", str(host_run)], stderr=subprocess.PIPE, text=True)
    said = next(line for line in host.stderr if "coordinator at " in line)
    host_err = []
    threading.Thread(target=lambda: host_err.extend(host.stderr), daemon=True).start()
    join = subprocess.Popen([sys.executable, "-m", "scalesgd", *ELASTIC, "--workers", "2", "--epochs", "10",
                             "--max-restarts", "1", "--join", said.split("coordinator at ")[1].split(";")[0],
                             "--run-dir", str(join_run)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(rounds(host_run) + rounds(join_run)) < 2 and time.monotonic() < deadline and join.poll() is None:
            time.sleep(0.05)
        victim = worker_pid(0, join.pid)  # forked by the joining launch itself, not by a fork server
        assert victim is not None and _children(join.pid) == [victim], "the joining launch's worker not found"
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        _, err = join.communicate(timeout=240)
        host.wait(timeout=60)
    finally:
        host.kill()
        join.kill()
    assert join.returncode == 0 and host.returncode == 0, (err, "".join(host_err))
    assert f"worker join-{os.uname().nodename}-{join.pid} was killed by SIGKILL; restarting it alone (restart 1 of 1)" \
        in err
    log = sorted(rounds(host_run) + rounds(join_run), key=lambda r: r["round"])
    assert [r["round"] for r in log] == list(range(len(log)))  # no round discarded or repeated
    joiner = lambda r: [m for m in r["members"] if m.startswith("join-")]
    survivors = [m for m in log[0]["members"] if m.startswith("host-w")]
    assert len(survivors) == 2 and all(set(survivors) <= set(r["members"]) for r in log)  # never restarted
    new = [r for r in log if r["at"] > killed_at and joiner(r) != joiner(log[0])]
    assert new and all(len(r["members"]) in (2, 3) for r in log), log  # a new joiner took part after the kill
    assert joiner(new[-1]) and len(log[-1]["members"]) == 3
    joined = next(r for r in new if joiner(r))
    assert joined["planned"][joined["members"].index(joiner(joined)[0])] == 0  # its state crossed behind the next
    summary = summary_of(host_run, join_run)  # round: no steps of its own in it
    assert summary["elastic"]["rounds"] == len(log)
    assert summary["elastic"]["members_at_end"] == 3  # each of the last round's members ended with the writer's state
    assert summary["final_test_acc"] > 0.5  # trained through it (digits: 10 classes)


def test_members_that_end_the_run_with_another_global_state_stop_it():
    assert ended_alike({"a": "d1", "b": "d1"}, "d1") == 2
    with pytest.raises(DivergedError, match="ended it with different global states: d1 here, {'b': 'd2'} there"):
        ended_alike({"a": "d1", "b": "d2"}, "d1")


@pytest.mark.parametrize(("options", "said"), [
    (["--workers", "2", "--min-workers", "3"], "--min-workers 3 is above --workers 2"),
    (["--join", "http://127.0.0.1:1"], "--join coordinator address 'http://127.0.0.1:1'"),
    (["--codec", "onebit", "--onebit-beta1", "0"], "--codec onebit's state belongs to a fixed set of workers"),
    (["--checkpoint-every", "5"], "--checkpoint-every 5: an --elastic run checkpoints its global state"),
])
def test_bad_elastic_options_end_in_one_line(options, said, tmp_path):
    done = scalesgd(*ELASTIC, "--epochs", "1", *options, "--run-dir", tmp_path / "run")
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_elastic_rounds_under_torchrun_without_an_address_to_join_end_in_one_line(tmp_path):
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}
    done = scalesgd(*ELASTIC, "--epochs", "1", "--run-dir", tmp_path / "run", env={**os.environ, **torchrun})
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "--elastic under torchrun: give every host's launch --join ADDRESS" in done.stderr


def test_a_grace_window_without_elastic_rounds_ends_in_one_line(tmp_path):
    done = scalesgd(*[a for a in ELASTIC if a != "--elastic"], "--elastic-grace", "2", "--run-dir", tmp_path / "run")
    assert done.returncode == 2 and done.stderr.strip() == ("scalesgd: error: --elastic-grace 2 is the grace window "
                                                            "of an --elastic run's rounds: add --elastic")


def test_joining_a_coordinator_that_is_not_there_ends_in_one_line_within_its_timeout(tmp_path):
    start = time.monotonic()
    done = scalesgd(*ELASTIC, "--epochs", "1", "--join", "http://127.0.0.1:9,127.0.0.1:9", "--timeout", "2",
                    "--run-dir", tmp_path / "run")
    assert done.returncode == 2 and "no coordinator answers at http://127.0.0.1:9,127.0.0.1:9" in done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - start < 20


def test_a_resumed_elastic_run_continues_its_rounds_clock_and_bytes(tmp_path):
    run = tmp_path / "run"
    first = scalesgd(*ELASTIC, "--workers", "2", "--epochs", "1", "--run-dir", run)
    assert first.returncode == 0, first.stderr
    before = rounds(run)
    again = scalesgd("train", "--resume", run, "--epochs", "2", "--quiet")
    assert again.returncode == 0, again.stderr
    after = rounds(run)[len(before):]
    assert [r["round"] for r in before + after] == list(range(len(before) + len(after)))
    assert after[0]["train_s"] > before[-1]["train_s"] and after[0]["bytes_sent"] > before[-1]["bytes_sent"]
    assert not set(after[0]["members"]) & set(before[-1]["members"])  # new processes, from the global state alone


def test_a_worker_at_half_speed_is_planned_fewer_steps_and_every_share_is_dealt(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", *ELASTIC, "--workers", "2", "--epochs", "4",
                             "--run-dir", str(run)], stderr=subprocess.PIPE, text=True)
    slowed = threading.Thread(target=half_speed, args=(proc,), daemon=True)
    slowed.start()
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    log = rounds(run)
    slow = [r for r in log if r["planned"][1] < r["planned"][0] == 4]
    assert len(slow) > len(log) // 2, log  # the slow member (rank 1: host-w1) planned fewer steps most rounds
    summary = json.loads((run / "summary.json").read_text())
    assert summary["elastic"]["fewest_members"] == 2  # never dropped: it arrives in time
    dealt = torch.load(run / "checkpoint.pt", weights_only=True)["elastic"]["shared"]["cursor"]
    assert 4 * summary["steps_per_epoch"] * 2 - dealt < 2  # every share but fewer than one a member at the end


def test_with_a_grace_window_a_worker_at_half_speed_is_left_out_of_the_rounds_it_is_late_for_and_heals(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", *ELASTIC, "--local-steps", "16", "--workers", "3",
                             "--epochs", "4", "--elastic-grace", "0.1", "--run-dir", str(run)],
                            stderr=subprocess.PIPE, text=True)
    slowed = threading.Thread(target=half_speed, args=(proc, 3), daemon=True)
    slowed.start()
    try:
        _, err = proc.communicate(timeout=240)
    finally:  # a run that hangs: its launcher stops its workers
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0, err
    log = rounds(run)
    assert all(planned == 16 for r in log for planned in r["planned"]), log  # no member planned fewer steps
    slow_in = [any(m.startswith("host-w1-") for m in r["members"]) for r in log]
    assert 0 < sum(slow_in) < len(log), slow_in  # left out of the rounds it was late for, healed back into others
    assert sorted(r["round"] for r in log) == list(range(len(log)))  # every round taken, none discarded (written
    summary = json.loads((run / "summary.json").read_text())  # by whoever was its first member: in any order)
    assert summary["elastic"]["members_at_end"] >= 2



def summary_of(*runs: Path) -> dict:
    """The summary the run's last writer wrote, in whichever launch's run directory it ran."""
    return next(json.loads((run / "summary.json").read_text()) for run in runs if (run / "summary.json").exists())


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def test_under_torchrun_a_process_joins_as_a_member_and_rejoins_when_torchrun_restarts_it(tmp_path):
    host_run, torchrun_run = tmp_path / "host", tmp_path / "torchrun"
    host = subprocess.Popen([sys.executable, "-m", "scalesgd", *ELASTIC, "--workers", "2", "--epochs", "35",
                             "--max-restarts", "1", "--run-dir", str(host_run)], stderr=subprocess.PIPE, text=True)
    said = next(line for line in host.stderr if "coordinator at " in line)  # as it starts
    address = said.split("coordinator at ")[1].split(";")[0]
    host_err = []
    threading.Thread(target=lambda: host_err.extend(host.stderr), daemon=True).start()
    joined = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                               "--max-restarts", "1", "-m", "scalesgd", *ELASTIC, "--workers", "2", "--epochs", "35",
                               "--join", address, "--run-dir", str(torchrun_run)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def torchrun_members() -> set[str]:
            logged = rounds(host_run) + rounds(torchrun_run)
            return {m for r in logged for m in r["members"] if not m.startswith("host-w")}

        deadline = time.monotonic() + 120
        while not torchrun_members() and time.monotonic() < deadline and joined.poll() is None:
            time.sleep(0.05)
        first = torchrun_members()
        workers = _children(joined.pid)
        assert len(first) == 1 and len(workers) == 1, (first, workers)
        os.kill(workers[0], signal.SIGKILL)
        _, joined_err = joined.communicate(timeout=120)
        host.wait(timeout=120)
    finally:
        host.kill()
        joined.kill()
    assert joined.returncode == 0 and host.returncode == 0, (joined_err[-3000:], "".join(host_err)[-3000:])
    logged = sorted(rounds(host_run) + rounds(torchrun_run), key=lambda r: r["round"])
    assert [r["round"] for r in logged] == list(range(len(logged)))  # no round lost or repeated across writers
    joiners = [{m for m in r["members"] if not m.startswith("host-w")} for r in logged]
    last = max(i for i, now in enumerate(joiners) if now == first)
    later = [now for now in joiners[last + 1:] if now]
    assert joiners[last + 1] == set() and later and first not in later  # dropped at the kill; a new incarnation back
    assert len(logged[-1]["members"]) == 3 and summary_of(host_run, torchrun_run)["elastic"]["members_at_end"] == 3
