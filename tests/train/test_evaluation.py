"""Evaluations between steps on a clock that leaves them out (and keeps checkpoints in), and the time budget that ends
a run."""

import json
import time

from scalesgd.train.evaluation import Milestones
from scalesgd.train.metrics import read
from tests.train.cli import FAST, scalesgd


def test_the_clock_leaves_out_what_runs_paused_and_counts_only_measured_bytes():
    clock = Milestones(every=4, budget_s=0.2, offset_s=1.0)
    time.sleep(0.05)
    with clock.paused():
        time.sleep(0.3)
    assert 1.04 < clock.train_s() < 1.2  # the offset and the sleep outside, not the 0.3 s inside
    assert not Milestones(budget_s=0).spent() and clock.spent()
    assert [i for i in range(1, 13) if clock.due(i)] == [4, 8, 12] and not Milestones().due(4)
    clock.count({"iteration_s": 0.1})  # DDP's own allreduce counts nothing
    assert clock.bytes_sent is None
    clock.count({"bytes_sent": 10})
    clock.count({"bytes_sent": 5})
    assert clock.bytes_sent == 15


def test_a_run_evaluates_every_n_steps_and_stops_when_its_time_budget_is_spent(tmp_path):
    run = tmp_path / "run"
    proc = scalesgd("train", *FAST, "--epochs", "3", "--eval-every", "2", "--time-budget", "0.3", "--engine",
                    "scalesgd", "--run-dir", str(run), "--sync-every", "1")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    records = read(run / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    steps = max(r["iter"] for r in records if r["kind"] == "iter")
    assert summary["stopped_by_time_budget"] and steps < 3 * summary["steps_per_epoch"]
    assert [e["iter"] for e in evals] == list(range(2, steps + 1, 2))
    clock = [e["train_s"] for e in evals]
    assert clock == sorted(clock) and clock[-1] < summary["train_s"] < 0.3 + 1.0  # stopped at its next loss read
    sent = [e["bytes_sent"] for e in evals]
    assert sent[1] == 2 * sent[0] > 0  # our engine's fp32 bytes: the same every step


def test_a_budget_spent_where_the_loss_is_read_only_at_an_epochs_end_stops_the_run_there(tmp_path):
    run = tmp_path / "run"  # an epoch of 12 steps, fewer than --sync-every: read at each epoch's last step alone
    proc = scalesgd("train", *FAST, "--epochs", "3", "--time-budget", "0.01", "--sync-every", "100", "--run-dir",
                    str(run))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    steps = max(r["iter"] for r in read(run / "metrics.jsonl") if r["kind"] == "iter")
    assert summary["stopped_by_time_budget"] and steps == summary["steps_per_epoch"] == 12


def test_the_links_count_leaves_out_what_was_sent_while_paused(monkeypatch):
    sent = iter([100, 150, 400, 500])  # at the start, before and after a checkpoint, at the reading
    monkeypatch.setattr("scalesgd.train.evaluation.link_bytes_sent", lambda: next(sent))
    clock = Milestones()
    with clock.paused():  # an evaluation that sends 250 bytes
        pass
    assert clock.link_bytes() == 500 - 100 - 250


def test_a_checkpoint_stays_on_the_clock_and_its_seconds_and_link_bytes_are_kept_apart(monkeypatch):
    sent = iter([100, 150, 400, 600])  # at the start, before and after a checkpoint, at the reading
    monkeypatch.setattr("scalesgd.train.evaluation.link_bytes_sent", lambda: next(sent))
    clock = Milestones(checkpoint_s=2.0)  # resumed after 2 s of earlier checkpoints
    began = time.perf_counter()
    with clock.checkpointing():
        time.sleep(0.2)  # the checkpoint's write
    took = time.perf_counter() - began
    assert 0.2 <= clock.train_s() and 2.2 <= clock.checkpoint_s <= 2.0 + took
    assert clock.checkpoint_link_bytes == 250 and clock.link_bytes() == 500  # on the link's count as well
    assert clock.reading()["checkpoint_s"] == clock.checkpoint_s
