"""The elastic launcher's decision when a worker says it lost the coordinator: restarted where the coordinator still
answers the launcher (the worker's own link was down, or its host frozen), the run stopped where it is gone."""

import pytest

from scalesgd.elastic.coordinator import Address
from scalesgd.errors import EXIT_PEER_LOST
from scalesgd.train import elastic_launch
from scalesgd.train.elastic_launch import FINISHED_KEY


class FakeWorker:
    """A worker that ends with `code` at its first poll."""

    def __init__(self, code: int):
        self.code = code

    def poll(self):
        return self.code

    def terminate(self):
        pass

    def wait(self, timeout=None):
        return self.code


class FakeStore:
    """The coordinator's store: it answers or not; the run finishes once the second worker ran."""

    def __init__(self, answers: bool):
        self.answers, self.finished = answers, False

    def check(self, keys):
        if not self.answers:
            raise RuntimeError("Connection reset by peer")
        return self.finished and keys == [FINISHED_KEY]


@pytest.mark.parametrize("answers", [True, False])
def test_a_worker_that_lost_the_coordinator_is_restarted_only_while_the_coordinator_answers(monkeypatch, tmp_path,
                                                                                              answers):
    store, started = FakeStore(answers), []

    def start(argv, env, stdout, here=False):
        started.append(env[elastic_launch.MEMBER_ENV])
        if len(started) == 1:
            return FakeWorker(EXIT_PEER_LOST)  # the coordinator lost, as its worker saw it
        store.finished = True
        return FakeWorker(0)

    monkeypatch.setattr(elastic_launch, "start", start)
    monkeypatch.setattr(elastic_launch, "POLL_S", 0.0)
    code = elastic_launch.supervise(["w"], tmp_path, Address.parse("http://127.0.0.1:1,127.0.0.1:2"), store,
                                    max_restarts=3)
    if answers:
        assert started == ["w", "w"] and code == 0
    else:
        assert started == ["w"] and code == EXIT_PEER_LOST
