"""Run directories: a fresh run never writes over another, its config reads back as it was written, and a run that
failed at its start leaves nothing that refuses the same command."""

import errno
from pathlib import Path

import pytest

from scalesgd.config import TrainConfig
from scalesgd.data.imagefolder.trees import write_fake_tree
from scalesgd.errors import UsageError
from scalesgd.train.rundir import (
    BUCKETS_NAME,
    CHECKPOINT_NAME,
    CONFIG_NAME,
    METRICS_NAME,
    PREVIOUS_CHECKPOINT_NAME,
    default_run_dir,
    discard_failed_start,
    prepare_new_run,
    read_config,
    write_config,
)
from tests.train.cli import scalesgd


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


def started(run_dir, *files: str, metrics: str = "") -> None:
    """What a new run writes before it has trained a step: its config, an empty log, other start-up files."""
    run_dir.mkdir()
    for name in (CONFIG_NAME, *files):
        (run_dir / name).write_text("{}")
    (run_dir / METRICS_NAME).write_text(metrics)


def test_a_failed_start_leaves_nothing_behind(tmp_path):
    run = tmp_path / "run"
    started(run, BUCKETS_NAME)
    discard_failed_start(run, made=True)
    assert not run.exists()
    prepare_new_run(TrainConfig.of(run_dir=str(run)))  # the same command is not refused


def test_a_failed_start_in_a_directory_it_did_not_make_empties_it_and_keeps_it(tmp_path):
    run = tmp_path / "run"
    started(run)
    discard_failed_start(run, made=False)
    assert run.is_dir() and list(run.iterdir()) == []


@pytest.mark.parametrize("left", ["logged", "checkpoint", "previous"])
def test_a_run_that_trained_or_checkpointed_keeps_everything(tmp_path, left):
    run = tmp_path / "run"
    started(run, metrics='{"kind": "iter", "iter": 1}\n' if left == "logged" else "")
    if left != "logged":
        (run / (CHECKPOINT_NAME if left == "checkpoint" else PREVIOUS_CHECKPOINT_NAME)).write_bytes(b"")
    before = sorted(p.name for p in run.iterdir())
    discard_failed_start(run, made=True)
    assert sorted(p.name for p in run.iterdir()) == before


def test_config_is_written_whole_or_not_at_all_and_a_full_disk_is_one_line(tmp_path, monkeypatch):
    write_config(TrainConfig.of(seed=1), tmp_path)

    write_text = Path.write_text

    def full(path, *args, **kwargs):  # the disk fills in the middle of the file
        write_text(path, '{"trunc')
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(UsageError, match=r"no space left writing .*config.json; free some and run the command again"):
        write_config(TrainConfig.of(seed=2), tmp_path)
    assert read_config(tmp_path).recipe.seed == 1 and [p.name for p in tmp_path.iterdir()] == [CONFIG_NAME]


def test_a_run_that_failed_on_a_bad_image_does_not_refuse_the_same_command_on_the_fixed_tree(tmp_path):
    tree, run = tmp_path / "tree", tmp_path / "run"
    write_fake_tree(tree, 2, 6, (32, 28), val_per_class=1)
    bad = tree / "train" / "n00000000" / "n00000000_bad.JPEG"
    bad.write_bytes(b"")
    argv = ["train", "--run-dir", str(run), "--workers", "1", "--quiet", "--dataset", "imagefolder", "--data-dir",
            str(tree), "--image-size", "16", "--model", "resnet8", "--batch-size", "4", "--epochs", "1",
            "--warmup", "none", "--loader-workers", "0"]
    failed = scalesgd(*argv)
    assert failed.returncode == 2 and f"{bad}: empty file" in failed.stderr
    assert not run.exists()
    bad.unlink()
    fixed = scalesgd(*argv)
    assert fixed.returncode == 0, fixed.stderr
    assert (run / CHECKPOINT_NAME).exists()
