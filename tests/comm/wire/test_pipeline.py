"""Jobs of steps in flight at once: the order the pipeline resumes them in."""

import pytest

from scalesgd.comm.wire.pipeline import run_pipelined


class Done:
    """A posted step that is already complete; it records when it was waited for."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait(self):
        self.log.append(("wait", self.name))


def job(log, name, steps):
    log.append(("start", name))
    for s in range(steps):
        yield [Done(log, f"{name}{s}")]
        log.append(("resume", f"{name}{s}"))
    return 10


def test_the_driver_keeps_depth_jobs_started_and_resumes_the_oldest_posted_step():
    log = []
    sent = run_pipelined((job(log, n, 2) for n in "abc"), depth=2)
    assert sent == 30
    assert log == [("start", "a"), ("start", "b"),
                   ("wait", "a0"), ("resume", "a0"),  # a posts a1 after b0: b0 is resumed first
                   ("wait", "b0"), ("resume", "b0"),
                   ("wait", "a1"), ("resume", "a1"),  # a is done: c starts
                   ("start", "c"),
                   ("wait", "b1"), ("resume", "b1"),
                   ("wait", "c0"), ("resume", "c0"), ("wait", "c1"), ("resume", "c1")]


def test_depth_one_runs_the_jobs_one_after_another():
    log = []
    run_pipelined((job(log, n, 1) for n in "ab"), depth=1)
    assert log == [("start", "a"), ("wait", "a0"), ("resume", "a0"), ("start", "b"), ("wait", "b0"), ("resume", "b0")]
    with pytest.raises(ValueError, match="depth 0"):
        run_pipelined([], depth=0)
