"""One finished two-worker run that several training tests read."""

import pytest

from tests.train.cli import FAST, scalesgd


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "two-workers"
    proc = scalesgd("train", "--workers", "2", "--epochs", "2", "--milestones", "2", "--run-dir", str(run), *FAST)
    assert proc.returncode == 0, proc.stderr
    return run
