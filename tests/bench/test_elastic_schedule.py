"""`bench elastic-schedule`: the failure schedule (its order, and each fault struck and undone on a real testbed), the
steps a fault can cost an elastic run, and the steps a restarted run computes again."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scalesgd.bench.elastic.figure import shown
from scalesgd.bench.elastic.injector import Schedule, Slowed, inject, worker_of
from scalesgd.bench.elastic.launches import LIMITED, REACHED, TargetWatch, finish
from scalesgd.bench.elastic.schedule import Watcher, lost_steps, merged, summarise
from scalesgd.testbed import netns
from tests.command import scalesgd

PREFIX = f"s{os.getpid() % 100000}"


def test_the_faults_take_turns_on_every_node_but_the_coordinators():
    schedule = Schedule(kinds=("kill", "stop", "link"))
    assert [schedule.plan(n, 4) for n in range(6)] == [("kill", 1), ("stop", 2), ("link", 3), ("kill", 1),
                                                       ("stop", 2), ("link", 3)]


def test_a_fault_costs_at_most_the_steps_planned_for_its_node_in_the_round_it_struck():
    rounds = [{"round": 0, "at": 10.0, "members": ["join-h-100-a", "join-h-200-b"], "planned": [16, 16]},
              {"round": 1, "at": 12.0, "members": ["join-h-100-a", "join-h-200-b"], "planned": [16, 9]},
              {"round": 2, "at": 15.0, "members": ["join-h-100-a"], "planned": [16]}]
    assert lost_steps(rounds, {"node": 2, "at": 13.0}, launcher=200) == 9  # planned at round 1 for round 2
    assert lost_steps(rounds, {"node": 2, "at": 16.0}, launcher=200) == 0  # already out of the rounds
    assert lost_steps(rounds, {"node": 2, "at": 5.0}, launcher=200) == 0  # before the first round


def test_the_seconds_to_the_target_and_to_the_next_round_leave_the_evaluations_out():
    run = {"launched": 100.0, "faults": [{"fault": "kill", "at": 130.0}, {"fault": "stop", "at": 150.0}],
           "boundaries": [120.0, 145.0, 152.0],  # the writer evaluated 131–141 between the kill and the next round
           "evals": [{"at": 141.0, "eval_s": 10.0, "test_loss": 2.5}, {"at": 170.0, "eval_s": 5.0, "test_loss": 2.2}],
           "evaluations": [{"at": 141.0, "eval_s": 10.0}, {"at": 170.0, "eval_s": 5.0}]}
    figures = summarise(run, target=2.3)
    assert figures["to_target_s"] == 70.0 - 15.0 and figures["final_loss"] == 2.2 and figures["eval_s"] == 15.0
    assert figures["to_round_s"] == [15.0 - 10.0, 2.0]


def write(path: Path, steps) -> None:
    path.write_text("".join(json.dumps({"kind": "iter", "iter": s}) + "\n" for s in steps))


def test_a_resumed_launch_counts_the_steps_it_computes_again_and_not_the_records_it_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    watcher = Watcher([path], local_steps=4)
    write(path, range(1, 11))  # the first launch reaches step 10, then dies
    watcher.read()
    watcher.start_attempt(4)  # resumed from its checkpoint at step 4: records up to 4 kept
    write(path, range(1, 5))
    watcher.read()
    assert watcher.computed() == 10
    write(path, range(1, 13))  # steps 5–12 computed again and on
    watcher.read()
    assert watcher.computed() == 10 + 8
    assert len(watcher.boundaries) == 2 + 2  # steps 4, 8; then 8 and 12 of the second launch


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
def test_each_fault_strikes_the_nodes_worker_or_the_whole_node_and_is_undone(tmp_path):
    assert scalesgd("testbed", "up", "--nodes", "2", "--prefix", PREFIX).returncode == 0
    spec = netns.read_state(PREFIX)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    named = [sys.executable, "-c", "import ctypes, time; ctypes.CDLL(None).prctl(15, b'scalesgd-r1'); time.sleep(60)"]
    in_node = ["ip", "netns", "exec", spec.node(1)]
    launcher = subprocess.Popen([*in_node, *sleeper, "-m", "scalesgd", "train", "--join", "x"])
    worker = subprocess.Popen([*in_node, *named])  # as a launch's forked worker is named
    try:
        schedule = Schedule(down_s=0.5, kinds=("kill", "stop", "link"))
        _until(lambda: worker_of(spec, 1) == worker.pid)
        inject(spec, schedule, 0, lambda: True)
        assert worker.wait(5) == -9 and launcher.poll() is None
        worker = subprocess.Popen([*in_node, *named])
        seen = {}
        struck = threading.Thread(target=inject, args=(spec, schedule, 1, lambda: True))  # stop: node 1
        struck.start()
        _until(lambda: state(launcher.pid) == "T" and state(worker.pid) == "T")
        struck.join()
        seen["stop"] = (state(launcher.pid), state(worker.pid))
        struck = threading.Thread(target=inject, args=(spec, Schedule(down_s=0.5, kinds=("link",)), 0, lambda: True))
        struck.start()
        _until(lambda: "state DOWN" in port(spec))
        struck.join()
        assert "T" not in seen["stop"] and "state UP" in port(spec)  # running again
        assert [f["fault"] for f in schedule.log] == ["kill", "stop"] and schedule.log[1]["back"] > schedule.log[1]["at"]
        with Slowed(spec, 1, 0.25) as slowed:  # a straggler: the node's worker in a CPU quota's group until the end
            assert slowed.ready.wait(10)
            held = "scalesgd-slow-" in Path(f"/proc/{worker.pid}/cgroup").read_text()
        assert held == slowed.held and "scalesgd-slow-" not in Path(f"/proc/{worker.pid}/cgroup").read_text()
    finally:
        for proc in (launcher, worker):
            proc.kill()
            proc.wait()
        scalesgd("testbed", "down", "--prefix", PREFIX)


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def port(spec) -> str:
    return subprocess.run(["ip", "-n", spec.switch, "link", "show", spec.switch_port(1)], capture_output=True,
                          text=True, check=False).stdout


def _until(condition, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the time given"
        time.sleep(0.02)


def test_the_figure_shows_the_lowest_seed_that_every_mode_ran():
    runs = [{"mode": "elastic", "seed": 0}, {"mode": "elastic", "seed": 1}, {"mode": "torchft", "seed": 1},
            {"mode": "elastic", "seed": 2}, {"mode": "torchft", "seed": 2}]
    assert [(r["mode"], r["seed"]) for r in shown(runs)] == [("elastic", 1), ("torchft", 1)]
    assert shown(runs[:1] + [{"mode": "torchft", "seed": 3}]) == []
    assert [(r["mode"], r["seed"]) for r in shown(runs, seed=0)] == [("elastic", 0)]  # the modes it has


def test_kept_only_tabulates_the_runs_kept_and_counts_those_that_missed_the_target(tmp_path):
    def kept(mode, seed, reached, at=110.0):
        evals = [{"iter": 32, "at": at, "eval_s": 10.0, "train_s": 90.0, "test_loss": 2.0 if reached else 2.5}]
        return {"mode": mode, "seed": seed, "code": 0, "launched": 0.0, "wall_s": 120.0, "evals": evals,
                "evaluations": [{"at": at, "eval_s": 10.0}], "faults": [], "boundaries": [], "restarts": 0,
                "goodput": 1.0, "mb_sent": 1.0, "dirs": [], "members_at_end": 4 if "elastic" in mode else None}

    (tmp_path / "runs").mkdir()
    for mode, seed, reached, at in (("fault-free", 0, True, 110.0), ("restart", 0, False, 110.0),
                                    ("restart", 1, True, 110.0), ("elastic-fault-free", 0, True, 90.0),
                                    ("elastic-slow", 0, True, 106.0)):
        (tmp_path / "runs" / f"{mode}-{seed}.json").write_text(json.dumps(kept(mode, seed, reached, at)))
    done = scalesgd("bench", "elastic-schedule", "--kept-only", "--prefix", "none-up", "--modes",
                    "fault-free,restart,elastic-fault-free,elastic-slow", "--seeds", "0,1", "--target", "2.2",
                    "--out", tmp_path, "--", "--local-steps", "16")
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "elastic-schedule.md").read_text()
    assert "| fault-free | 0 | 100.0 | 1.00 |" in table  # 110 s to the target less its 10 s evaluating
    assert "| restart | 0,1 | 100.0; not reached in 1 of 2 |" in table
    assert "| elastic-fault-free | 0 | 80.0 | 0.80 |" in table
    assert "| elastic-slow | 0 | 96.0 | 0.96 | 100.0 | 2.0000 | 1.0 | 0 | — | 0 | 4 |" in table  # 4 ended alike


def test_a_run_is_stopped_once_an_evaluation_reaches_the_target_and_not_before(tmp_path):
    path = tmp_path / "node1" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps({"kind": "eval", "iter": 32, "test_loss": 2.5}) + "\n")
    launch = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with TargetWatch(tmp_path, 2.2) as watch:
        assert finish(launch, time.monotonic() + 1.0, watch.reached) == LIMITED  # 2.5: not there yet
        launch = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with path.open("a") as out:
            out.write(json.dumps({"kind": "eval", "iter": 64, "test_loss": 2.1}) + "\n")
        started = time.monotonic()
        assert finish(launch, time.monotonic() + 30, watch.reached) == REACHED
    assert time.monotonic() - started < 5 and launch.returncode == -15  # SIGTERMed, well before its deadline


def test_evaluations_at_once_on_two_members_are_left_out_of_the_clock_once():
    assert merged([(5.0, 8.0), (0.0, 2.0), (1.0, 3.0), (8.0, 9.0)]) == [(0.0, 3.0), (5.0, 9.0)]
    run = {"launched": 0.0, "faults": [], "evals": [{"at": 20.0, "test_loss": 2.0, "train_s": 5.0}],
           "evaluations": [{"at": 10.0, "eval_s": 6.0}, {"at": 12.0, "eval_s": 6.0}]}  # 4–10 and 6–12: 8 s
    assert summarise(run, 2.2)["to_target_s"] == 12.0
    run["boundaries"] = [11.0]  # the others committed a round during the second: it held nobody up
    assert summarise(run, 2.2)["to_target_s"] == 14.0
