"""Run directories: a fresh run never writes over another, and its config reads back as it was written."""

import pytest

from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.train.rundir import CHECKPOINT_NAME, CONFIG_NAME, default_run_dir, prepare_new_run, read_config


def test_a_new_run_gets_its_own_directory_and_its_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = prepare_new_run(TrainConfig.of(seed=5))
    second = default_run_dir()
    assert first.parent.name == "runs" and second != first  # the same second: a suffix keeps them apart
    assert read_config(first) == TrainConfig.of(seed=5, run_dir=str(first))


def test_a_directory_holding_files_is_refused_and_left_alone(tmp_path):
    (tmp_path / CONFIG_NAME).write_text("{}")
    with pytest.raises(UsageError, match="`run_dir` .* already holds files but no checkpoint"):
        prepare_new_run(TrainConfig.of(run_dir=str(tmp_path)))
    assert (tmp_path / CONFIG_NAME).read_text() == "{}"
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"")
    with pytest.raises(UsageError, match="`run_dir` .* already holds a run; .* with `resume`"):
        prepare_new_run(TrainConfig.of(run_dir=str(tmp_path)))
