"""The loss window's reads: in a fixed group a window's allreduce is waited for only at the next window's end,
every iteration is still logged once and in order, flags and a non-finite loss are read with their window, and
where the group may change the window is read at once."""

import pytest
import torch

from scalesgd.elastic.membership import ElasticMembership
from scalesgd.errors import NonFiniteLoss
from scalesgd.train import metrics
from scalesgd.train.progress import EpochProgress
from scalesgd.train.window import WindowReads


class Work:
    """An allreduce in flight among two ranks holding the same rows: they are doubled when it is waited for."""

    def __init__(self, tensor):
        self.tensor, self.waited = tensor, False

    def wait(self):
        self.tensor.mul_(2)
        self.waited = True


class TwoRanks:
    may_abort = False

    def __init__(self):
        self.started = []

    def all_reduce(self, tensor):
        return tensor.mul_(2)

    def all_reduce_started(self, tensor):
        self.started.append(Work(tensor))
        return self.started[-1]


def window(losses, flags=(False, False)):
    """A window of rows (loss, correct, samples, two norms) and its iterations' records, from 1 on."""
    rows = torch.zeros(len(losses) + 1, 5, dtype=torch.float64)
    rows[: len(losses), 0], rows[: len(losses), 2] = torch.tensor(losses), 1.0
    return rows, flags


def records(first, n):
    return [{"kind": "iter", "epoch": 1, "iter": first + i, "lr": 0.1, "notices": []} for i in range(n)]


def logged(path):
    return [(r["iter"], r["loss"]) for r in metrics.read(path) if r["kind"] == "iter"]


def test_in_a_fixed_group_a_window_is_waited_for_only_when_the_next_is_sent(tmp_path):
    members, log = TwoRanks(), metrics.MetricsLog(tmp_path / "m.jsonl")
    reads = WindowReads(members, log, EpochProgress(False, 1), lagged=True)
    rows, flags = window([1.0, 2.0], (True, False))
    first = reads.send(rows, 2, flags, records(1, 2))
    assert first.rows.shape == (0, 5) and not members.started[0].waited and logged(tmp_path / "m.jsonl") == []
    rows, flags = window([3.0, 4.0])
    second = reads.send(rows, 2, flags, records(3, 2))  # the steps between ran with the first window in flight
    assert members.started[0].waited and not members.started[1].waited
    assert second.rows[:, 0].tolist() == [2.0, 4.0] and second.due and not second.spent  # rank 0's flag, summed
    assert logged(tmp_path / "m.jsonl") == [(1, 1.0), (2, 2.0)]  # the loss is the global mean: sum ÷ samples
    last = reads.drain()
    assert last.rows[:, 0].tolist() == [6.0, 8.0] and not last.due and reads.drain().rows.shape == (0, 5)
    assert logged(tmp_path / "m.jsonl") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


def test_where_the_group_may_change_a_window_is_read_when_it_is_sent(tmp_path):
    members = TwoRanks()
    reads = WindowReads(members, None, EpochProgress(False, 1), lagged=False)
    rows, flags = window([1.0], (False, True))
    read = reads.send(rows, 1, flags, records(1, 1))
    assert read.rows[:, 0].tolist() == [2.0] and read.spent and members.started == []
    with pytest.raises(RuntimeError, match="fixed group"):
        ElasticMembership().all_reduce_started(torch.zeros(1))  # a lagged read is refused where groups change


def test_a_non_finite_loss_is_named_by_its_iteration_when_its_window_is_read(tmp_path):
    reads = WindowReads(TwoRanks(), None, EpochProgress(False, 1), lagged=True)
    rows, flags = window([1.0, float("nan")])
    reads.send(rows, 2, flags, records(7, 2))
    with pytest.raises(NonFiniteLoss, match="iteration 8"):
        reads.drain()
