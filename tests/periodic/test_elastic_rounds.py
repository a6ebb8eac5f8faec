"""DiLoCo among whoever is alive, faults real (processes killed, stopped, joining): after each, the survivors' and
joiners' global state equal by hash, no round discarded, the run ends and nothing hangs."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import tempfile
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from scalesgd.bench.elastic import worker as elastic_worker
from scalesgd.elastic import Coordinator
from scalesgd.elastic.heal import Healing
from scalesgd.periodic import elastic_rounds
from scalesgd.periodic.elastic_rounds import HEALING, planned_steps

pytest.importorskip("torchft")

STEPS = 40  # ten rounds of H = 4
CONTEXT = multiprocessing.get_context("forkserver")


def start(name, coordinator, out, faults=None, steps=STEPS, codec="fp32", workers=3):
    process = CONTEXT.Process(target=elastic_worker.run, name=name,
                              args=(name, str(coordinator.address), out, steps, faults or {}, codec, workers))
    process.start()
    return process


def wait_round(coordinator, name: str, number: int) -> None:
    """Until `name` has committed round `number` (an event in the store, not a sleep)."""
    coordinator.store.wait([f"progress/{name}/{number}"])


def finished(processes, out) -> dict:
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode is not None, f"{process.name} still running"
    return {p.name: torch.load(Path(out) / f"{p.name}.pt", weights_only=False)
            for p in processes if p.exitcode == 0}


def assert_equal_states(results: dict) -> None:
    digests = {name: r["digest"] for name, r in results.items()}
    assert len(set(digests.values())) == 1, digests
    first = next(iter(results.values()))["global"]
    for r in results.values():
        assert all(torch.equal(a, b) for a, b in zip(first, r["global"]))


@pytest.fixture
def coordinator():
    with Coordinator(min_workers=1, heartbeat_timeout_s=1.5, join_timeout_s=0.5) as served:
        yield served


@pytest.fixture
def out():
    with tempfile.TemporaryDirectory() as folder:
        yield folder


def test_a_worker_killed_between_rounds_is_dropped_and_the_others_finish(coordinator, out):
    workers = [start("w0", coordinator, out), start("w1", coordinator, out),
               start("w2", coordinator, out, {"kill": 10})]
    results = finished(workers, out)
    assert workers[2].exitcode == -signal.SIGKILL and sorted(results) == ["w0", "w1"]
    assert_equal_states(results)
    log = results["w0"]["log"]
    assert [entry["round"] for entry in log] == list(range(10))  # no round discarded
    assert [len(entry["members"]) for entry in log] == [3, 3] + [2] * 8


def test_a_live_worker_late_to_a_round_is_waited_for_not_left_out(out):
    """The coordinator's join window (its default): a member still busy (a slow link's exchange, an evaluation) but
    heartbeating is waited for; with the old 1 s window it was left out and healed again (a rotation on 10 Mbit/s)."""
    with Coordinator(min_workers=1, heartbeat_timeout_s=1.5) as served:
        workers = [start("w0", served, out), start("w1", served, out), start("w2", served, out, {"late": (10, 2.5)})]
        results = finished(workers, out)
    assert sorted(results) == ["w0", "w1", "w2"]
    assert_equal_states(results)
    assert [len(entry["members"]) for entry in results["w0"]["log"]] == [3] * 10


def test_a_worker_killed_inside_the_reduce_is_retried_among_the_survivors(coordinator, out):
    """With fp8 on the wire: its state is put back as the round found it before the round is reduced again."""
    workers = [start("w0", coordinator, out, codec="fp8"), start("w1", coordinator, out, codec="fp8"),
               start("w2", coordinator, out, {"kill_in_reduce": 4}, codec="fp8")]
    results = finished(workers, out)
    assert workers[2].exitcode == -signal.SIGKILL
    assert_equal_states(results)
    log = {entry["round"]: entry for entry in results["w0"]["log"]}
    assert sorted(log) == list(range(10))
    assert log[4]["retries"] >= 1 and len(log[4]["members"]) == 2 and len(log[3]["members"]) == 3


def test_a_stopped_worker_is_dropped_then_heals_and_rejoins(coordinator, out):
    workers = [start("w0", coordinator, out), start("w1", coordinator, out),
               start("w2", coordinator, out, {"stop": 10})]
    wait_round(coordinator, "w0", 5)  # the others went on without it
    os.kill(workers[2].pid, signal.SIGCONT)
    results = finished(workers, out)
    assert sorted(results) == ["w0", "w1", "w2"]
    assert_equal_states(results)
    members = [len(entry["members"]) for entry in results["w0"]["log"]]
    assert 2 in members and members[-1] == 3
    assert results["w2"]["healed_from"] in {m for e in results["w0"]["log"] for m in e["members"]}
    back = results["w0"]["log"][members.index(2) + members[members.index(2):].index(3)]
    assert back["late"] == 4 and back["weight"] == 3 * 4  # the round it was stopped in, its 4 steps, counted late


def test_a_worker_stopped_inside_the_reduce_is_dropped_after_the_grace_window_then_rejoins(coordinator, out):
    workers = [start("w0", coordinator, out), start("w1", coordinator, out),
               start("w2", coordinator, out, {"stop_in_reduce": 3})]
    wait_round(coordinator, "w0", 6)  # round 3 retried without it, and more after
    os.kill(workers[2].pid, signal.SIGCONT)
    results = finished(workers, out)
    assert sorted(results) == ["w0", "w1", "w2"]
    assert_equal_states(results)
    log = {entry["round"]: entry for entry in results["w0"]["log"]}
    assert sorted(log) == list(range(10))
    assert log[3]["retries"] >= 1 and len(log[3]["members"]) == 2 and len(log[9]["members"]) == 3
    back = next(log[r] for r in range(4, 10) if len(log[r]["members"]) == 3)
    assert back["late"] == 4 and back["weight"] == 3 * 4  # its pseudo-gradient of round 3 reduced late, not lost


def test_a_new_worker_joins_a_running_job_and_heals_from_a_peer(coordinator, out):
    """With fp8 on the wire: the joiner takes the ranges every member shares, and when they are measured."""
    workers = [start(f"w{i}", coordinator, out, {"await_at": (14, "joiner")}, codec="fp8", workers=2)
               for i in range(2)]
    wait_round(coordinator, "w0", 2)  # under way: the joiner is not in the first quorum
    workers.append(start("w2", coordinator, out, {"announce": "joiner"}, codec="fp8"))
    results = finished(workers, out)
    assert sorted(results) == ["w0", "w1", "w2"]
    assert_equal_states(results)
    assert results["w2"]["steps"] == STEPS and results["w2"]["healed_from"] is not None
    sizes = [len(entry["members"]) for entry in results["w0"]["log"]]
    assert sizes[:3] == [2, 2, 2] and sizes[-1] == 3


def test_healing_behind_a_joiner_sits_out_until_its_state_lands_and_ends_on_the_others_state(coordinator, out):
    """The others wait for none of its state: the round after it joins plans it no steps; once its state has
    landed (the rounds committed meanwhile replayed on it) it takes every step again."""
    behind = {"heal_behind": True}
    workers = [start(f"w{i}", coordinator, out, {**behind, "await_at": (14, "joiner")}, codec="fp8", workers=2)
               for i in range(2)]
    wait_round(coordinator, "w0", 2)
    workers.append(start("w2", coordinator, out, {**behind, "announce": "joiner"}, codec="fp8"))
    results = finished(workers, out)
    assert sorted(results) == ["w0", "w1", "w2"]
    assert_equal_states(results)
    log = results["w0"]["log"]
    joined = next(i for i, entry in enumerate(log) if len(entry["members"]) == 3)
    rank = log[joined]["members"].index(next(m for m in log[joined]["members"] if m.startswith("w2-")))
    assert log[joined]["planned"][rank] == 0 and log[-1]["planned"][rank] == 4, log


def test_healing_behind_a_sender_killed_before_the_state_crossed_is_replaced_by_another(coordinator, out):
    """w0 (the first up to date, in rank order: the joiner's sender) dies once the joiner has its counters: the
    round is retried without it and the joiner heals from w1."""
    behind = {"heal_behind": True, "await_at": (14, "joiner")}
    workers = [start("w0", coordinator, out, {**behind, "kill_sending_heal": True}, workers=2),
               start("w1", coordinator, out, behind, workers=2)]
    wait_round(coordinator, "w0", 2)
    workers.append(start("w2", coordinator, out, {"heal_behind": True, "announce": "joiner"}))
    results = finished(workers, out)
    assert workers[0].exitcode == -signal.SIGKILL and sorted(results) == ["w1", "w2"]
    assert_equal_states(results)
    assert results["w2"]["healed_from"].startswith("w1-")


def test_healing_behind_a_joiner_whose_only_sender_dies_stops_rather_than_start_the_run_over(coordinator, out):
    sender = {"heal_behind": True, "await_at": (14, "joiner"), "kill_sending_heal": True}
    workers = [start("w0", coordinator, out, sender, workers=1)]
    wait_round(coordinator, "w0", 2)
    workers.append(start("w1", coordinator, out, {"heal_behind": True, "announce": "joiner"}, workers=1))
    finished(workers, out)
    assert workers[0].exitcode == -signal.SIGKILL and workers[1].exitcode == 3
    said = torch.load(Path(out) / "w1.pt", weights_only=False)["error"]
    assert "every member that held the run's global state left" in said and "last checkpoint" in said


def test_a_state_that_never_crossed_leaves_the_member_holding_nothing_and_its_next_group_built_anew():
    rounds = elastic_rounds.ElasticRounds(SimpleNamespace(members=SimpleNamespace(elastic=None)))
    never: Future = Future()
    never.set_exception(RuntimeError("Connection closed by peer"))
    rounds.synced_at, rounds._healing = 8, Healing({"digest": "0" * 16}, never, source=1)
    assert not rounds.holds_state and rounds.step == 0  # still crossing: it says it holds nothing
    rounds.land()
    assert not rounds.holds_state and rounds.step == 0 and rounds._lost  # healed again, in a group built anew


def test_a_member_whose_newer_state_is_still_crossing_is_not_healed_from_an_older_one(monkeypatch):
    """Named behind (it says it holds nothing yet) in a quorum whose best holds round 3, while round 5's state
    crosses to it: taking round 3's would lose rounds 3 and 4, so it refuses (the round asked again once it lands)."""
    crossing = Healing({"rounds": 5, "digest": "1" * 16}, Future(), source=2)
    older = Healing({"rounds": 3, "digest": "0" * 16}, Future(), source=0)
    monkeypatch.setattr(elastic_rounds, "heal_behind", lambda *args: older)
    rounds = elastic_rounds.ElasticRounds(SimpleNamespace(members=SimpleNamespace(
        elastic=SimpleNamespace(heal_behind=True)), rounds=5))
    rounds.synced_at, rounds._healing = 20, crossing
    with pytest.raises(elastic_rounds.NewerCrossing, match="older than the one still crossing"):
        rounds._heal(SimpleNamespace(steps=(4, 0), rank=1))
    assert rounds._healing is crossing and rounds.synced_at == 20  # nothing of the older state taken


def test_a_worker_killed_between_its_quorum_and_its_group_is_dropped_and_the_others_go_on(coordinator, out):
    """A joiner named in the next quorum dies before the group is built: the others notice its heartbeats stop,
    ask the lighthouse again and go on (before, they waited out the rendezvous's 60 s and ended with an error)."""
    workers = [start(f"w{i}", coordinator, out, {"await_at": (14, "joiner")}, workers=2) for i in range(2)]
    wait_round(coordinator, "w0", 2)
    workers.append(start("w2", coordinator, out, {"announce": "joiner", "kill_in_regroup": True}))
    results = finished(workers, out)
    assert workers[2].exitcode == -signal.SIGKILL and sorted(results) == ["w0", "w1"]
    assert_equal_states(results)
    log = results["w0"]["log"]
    assert [entry["round"] for entry in log] == list(range(10)) and {len(e["members"]) for e in log} == {2}


def test_a_worker_killed_inside_its_groups_rendezvous_is_dropped_and_the_others_build_one_without_it(coordinator,
                                                                                                      out):
    """Every member came to build the group, then the joiner died: the others' rendezvous times out (3 s here),
    they count that group failed once for all in the store and build the next without it."""
    quick = {"group_timeout_s": 3.0}
    workers = [start(f"w{i}", coordinator, out, {"await_at": (14, "joiner"), **quick}, workers=2) for i in range(2)]
    wait_round(coordinator, "w0", 2)
    workers.append(start("w2", coordinator, out, {"announce": "joiner", "kill_in_rendezvous": True, **quick}))
    results = finished(workers, out)
    assert workers[2].exitcode == -signal.SIGKILL and sorted(results) == ["w0", "w1"]
    assert_equal_states(results)
    log = results["w0"]["log"]
    assert [entry["round"] for entry in log] == list(range(10)) and {len(e["members"]) for e in log} == {2}


@pytest.mark.parametrize("codec", ["topk", "sparseloco", "lowrank-acp"])
def test_with_error_feedback_a_joiner_heals_what_members_share_and_starts_its_own_residual_at_zero(coordinator, out,
                                                                                                  codec):
    """Top-k's residuals and thresholds are each member's: the joiner's start at zero and its empty first round sends
    nothing, so they are zero when it is built. Low rank's factors are shared: lowrank-acp decodes a round with the P
    the last one left (a joiner with another P decodes another mean: the states would differ); its error feedback is
    each member's M minus the shared approximation, which a joiner's first round (M = 0) already makes non-zero."""
    workers = [start(f"w{i}", coordinator, out, {"await_at": (14, "joiner")}, codec=codec, workers=2)
               for i in range(2)]
    wait_round(coordinator, "w0", 2)  # under way: the members hold residuals the joiner must not take
    workers.append(start("w2", coordinator, out, {"announce": "joiner"}, codec=codec))
    results = finished(workers, out)
    assert sorted(results) == ["w0", "w1", "w2"] and results["w2"]["healed_from"] is not None
    assert_equal_states(results)  # every round's mean decoded alike
    if codec in ("topk", "sparseloco"):
        assert results["w2"]["own_at_join"] == 0.0  # not the peer's residual it healed from
    assert all(r["own_at_end"] != 0.0 for r in results.values())  # each member kept what it has not yet sent


def _plain(rank, world, steps):
    """The same workers' training under a fixed group: plain DiLoCo."""
    from scalesgd.periodic import DiLoCo

    name = f"w{rank}"
    model = elastic_worker.model_of(name)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    with DiLoCo(model, inner, elastic_worker.H) as diloco:
        for step in range(steps):
            x, y = elastic_worker.batches(name, step)
            torch.nn.functional.mse_loss(model(x), y).backward()
            inner.step()
            inner.zero_grad()
        diloco.finish()
    return [p.detach().clone() for p in diloco.global_params]


def test_without_faults_the_rounds_are_plain_diloco(coordinator, out):
    from tests.spawn_util import run_workers

    workers = [start(f"w{i}", coordinator, out, workers=2) for i in range(2)]
    elastic = finished(workers, out)["w0"]["global"]
    plain = run_workers(_plain, 2, STEPS)[0]
    for a, b in zip(elastic, plain):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_joiner_of_another_configuration_is_refused_and_the_others_go_on(coordinator, out):
    workers = [start(f"w{i}", coordinator, out, {"await_at": (14, "joiner")}, workers=2) for i in range(2)]
    workers.append(start("w2", coordinator, out, {"announce": "joiner"}, codec="fp8"))
    results = finished(workers, out)
    assert workers[2].exitcode == 1 and sorted(results) == ["w0", "w1"]
    assert_equal_states(results)
    assert all(len(entry["members"]) == 2 for entry in results["w0"]["log"])


def test_diloco_refuses_what_elastic_rounds_cannot_take_naming_it():
    from torch import nn

    from scalesgd.elastic.membership import ElasticMembership
    from scalesgd.periodic import DiLoCo

    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="elastic rounds .* one fragment and overlap_steps 0"):
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), 4, overlap_steps=1,
               group=ElasticMembership(elastic=object()))
    with pytest.raises(ValueError, match="codec onebit: elastic rounds take a codec whose state splits into what"):
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), 4, codec="onebit",
               group=ElasticMembership(elastic=object()))


def test_a_slower_member_is_planned_the_steps_it_takes_in_the_typical_ones_time():
    assert planned_steps((0.10, 0.20, 0.11, 0.0), 16, 1.25) == (16, 9, 16, 16)  # jitter, the unmeasured: H
    assert planned_steps((0.1, 5.0), 4, 1.25) == (4, 1)  # of two, the faster sets the pace; at least one step
    assert planned_steps((0.1, 5.0), 4, None) == (4, 4)  # lockstep
    assert planned_steps((0.05, 0.11, 0.10, HEALING), 16, 1.25) == (16, 16, 16, 0)  # one alone on the cores: not
    # the pace of the others, who are not slow; one healing: none


def test_a_worker_stopped_part_of_every_period_is_paced_by_its_mean_step(monkeypatch):
    """Stopped for a while every few steps, most of its steps run at full speed and one in three waits out a stop:
    the median says full speed; the steps it takes in a given time say half."""
    clock = iter(itertools.accumulate([0.0] + [0.025, 0.025, 0.1] * 4))
    monkeypatch.setattr(elastic_rounds.time, "monotonic", lambda: next(clock))
    rounds = elastic_rounds.ElasticRounds(SimpleNamespace(members=SimpleNamespace(elastic=None)))
    rounds.synced_at = None
    for _ in range(7):
        rounds.stepped()
    assert rounds.pace() == pytest.approx(0.05)
    assert planned_steps((0.025, rounds.pace()), 4, 1.25) == (4, 2)  # by the median (0.025): 4, lockstep
