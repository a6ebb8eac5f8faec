"""Checkpoints: an interrupted run resumes to exactly the parameters of an uninterrupted one; nothing is lost."""

import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp

from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.runtime.process_group import DistEnv
from scalesgd.train import checkpoint
from scalesgd.train.checkpoint import NoSpace, finished, load_latest, save_atomic
from scalesgd.train import rank_states, shards
from scalesgd.train.metrics import read
from tests.train.cli import load_ckpt, scalesgd, wait_for_checkpoint


def test_resume_with_a_conflicting_option_is_refused_and_changes_nothing(finished_run, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    (run / "summary.json").unlink()
    before = (run / "checkpoint.pt").read_bytes()
    proc = scalesgd("train", "--resume", str(run), "--batch-size", "64")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--batch-size 64 differs from the run's 128" in proc.stderr
    proc = scalesgd("train", "--resume", str(run))
    assert proc.returncode == 2 and "already finished all 2 epochs" in proc.stderr
    assert (run / "checkpoint.pt").read_bytes() == before


def test_an_adascale_run_is_finished_when_its_schedule_is_done_not_at_its_epoch_count():
    stored = TrainConfig.from_argv(["--lr-scaling", "adascale", "--workers", "2", "--epochs", "2"])
    more = TrainConfig.from_argv(["--lr-scaling", "adascale", "--workers", "2", "--epochs", "3"])

    def state(epoch, progress):
        factor = {"schedule": {"total_steps": 100}, "scale": 4.0, "gain": 2.0, "progress": progress}  # as stored
        return {"epoch": epoch, "scheduler": {"lr_lambdas": [factor]}}

    assert not finished(state(5, 99.0), stored, stored)  # past --epochs, its schedule not yet done: it goes on
    assert finished(state(5, 100.5), stored, stored)
    assert not finished(state(5, 100.5), stored, more)  # more epochs stretch the schedule
    linear = TrainConfig.from_argv(["--epochs", "2", "--warmup-epochs", "1"])
    assert finished(state(2, 0.0), linear, linear) and not finished(state(1, 0.0), linear, linear)


RESUME_RUN = ["--quiet", "--dataset", "synthetic", "--samples", "1024", "--image-size", "12",
              "--model", "resnet8", "--batch-size", "64", "--epochs", "3", "--warmup-epochs", "1",
              "--schedule", "cosine", "--seed", "7"]


FP8_RANGES = ["--fp8-period", "7", "--fp8-samples", "64"]  # ranges re-estimated, from samples, within epochs


# Each case covers what another would repeat: DDP's engine with a hook's state (fp8's ranges) under LARS and the
# arc-cotangent schedule, ours with top-k's reused thresholds and DGC's momentum (each state a resume must restore),
# that one killed past a checkpoint in the middle of an epoch (the data's order and position restored too).
@pytest.mark.parametrize("engine", [["--codec", "fp8", *FP8_RANGES, "--optimizer", "lars", "--weight-decay", "5e-4",
                                     "--schedule", "arccot", "--arccot-epoch", "2", "--label-smoothing", "0.1",
                                     "--bn-momentum", "0.05", "--bn-batch", "8"],
                                    ["--engine", "scalesgd", "--codec", "topk", "--topk-reuse", "3", "--density",
                                     "0.05", "--momentum-correction", "--density-warmup", "2", "--local-clip", "1.0",
                                     "--weight-decay", "5e-4", "--checkpoint-every", "4"],  # killed mid-epoch
                                    ["--engine", "scalesgd", "--codec", "onebit", "--optimizer", "onebit-adam",
                                     "--base-lr", "0.001", "--precision", "fp16", "--accumulate", "2",
                                     "--compress-after", "10", "--samples", "512", "--image-size", "6"],
                                    # errors, frozen variance, loss scale saved (6 px: fp16 is emulated on a CPU)
                                    ["--engine", "scalesgd-fsdp", "--shard", "node", "--procs-per-node", "1",
                                     "--local-steps", "6", "--fragments", "2", "--overlap-steps", "1", "--mix", "0.25",
                                     "--codec", "topk", "--density", "0.05", "--accumulate", "2"]],
                         # 2 nodes of 1, each a Streaming DiLoCo replica: parameters and momentum through
                         # torch.distributed.checkpoint (which keeps one node's); each rank's local parameters, inner
                         # state, global ones, outer momentum and residuals beside them, and an exchange in flight
                         ids=["ddp-fp8-hook-lars-arccot", "scalesgd-topk-dgc", "onebit-adam-fp16-accumulated",
                              "fsdp-hybrid-streaming-topk"])
def test_interrupted_and_resumed_run_ends_with_the_same_parameters(tmp_path, engine):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run = [*RESUME_RUN, *engine]
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(broken), *run],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_checkpoint(broken, proc)
    while "--checkpoint-every" in run and proc.poll() is None and load_ckpt(broken)["step"] == 0:
        time.sleep(0.05)  # past a checkpoint within an epoch
    os.killpg(proc.pid, signal.SIGKILL)  # launcher and workers die mid-epoch, as on a lost machine
    proc.wait()
    assert not (broken / "summary.json").exists(), "the run finished before it could be interrupted"
    interrupted = load_ckpt(broken)
    assert interrupted["epoch"] < 3 and (interrupted["step"] > 0) == ("--checkpoint-every" in run)

    resumed = scalesgd("train", "--resume", str(broken))
    assert resumed.returncode == 0, resumed.stderr
    uninterrupted = scalesgd("train", "--run-dir", str(whole), *run)
    assert uninterrupted.returncode == 0, uninterrupted.stderr

    a, b = load_ckpt(whole), load_ckpt(broken)
    assert a["epoch"] == b["epoch"] == 3
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    lines = lambda run: [(r["kind"], r["iter"], r.get("loss"), r.get("test_acc"))
                         for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert lines(whole) == lines(broken)
    sent = lambda run: json.loads((run / "summary.json").read_text())["bytes_sent"]
    assert sent(whole) == sent(broken)  # the bytes before the checkpoint counted once, those after it too
    if "--codec" in run and "fp8" not in run:  # residuals, replicas: each rank's own file, none in rank 0's
        assert "codec_states" not in b and sorted(p.name for p in (broken / b["rank_states"]).iterdir()) == \
            ["rank0.pt", "rank1.pt"] and len(list(broken.glob("ranks-*"))) == 2  # the latest's and the one before's


def test_save_is_atomic_and_leaves_nothing_behind_when_writing_fails(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_atomic({"epoch": 1}, path)
    with pytest.raises((AttributeError, pickle.PicklingError)):  # by where the lambda is defined
        save_atomic({"epoch": 2, "bad": lambda: None}, path)  # cannot be pickled: the write fails midway
    assert torch.load(path, weights_only=True) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_the_checkpoint_before_is_kept_beside_the_latest(tmp_path):
    path, previous = tmp_path / "checkpoint.pt", tmp_path / "checkpoint.prev.pt"
    for epoch in (1, 2, 3):
        save_atomic({"epoch": epoch}, path, keep_previous=previous)
    assert torch.load(path, weights_only=True) == {"epoch": 3}
    assert torch.load(previous, weights_only=True) == {"epoch": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]


def test_a_torn_latest_checkpoint_resumes_from_the_one_before_with_one_line(finished_run, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    (run / "summary.json").unlink()
    previous_epoch = torch.load(run / "checkpoint.prev.pt", weights_only=True)["epoch"]
    whole = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(whole[: len(whole) // 2])  # torn, as by a full disk
    (run / ".checkpoint.pt.abc123.tmp").write_bytes(b"")  # what a killed writer leaves
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "iter", "ep')  # torn last line
    proc = scalesgd("train", "--resume", str(run))
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(notes) == 1 and "checkpoint.pt is unreadable" in notes[0]
    assert f"resuming from checkpoint.prev.pt, epoch {previous_epoch}" in notes[0]
    assert load_ckpt(run)["epoch"] == 2 and not list(run.glob(".*.tmp"))
    records = read(run / "metrics.jsonl")
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [1, 2]


def test_a_damaged_metrics_line_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"epoch": 1}\nnot json\n{"epoch": 2}\n')
    with pytest.raises(UsageError, match="line 2 is not a JSON record"):
        read(tmp_path / "m.jsonl")
    (tmp_path / "t.jsonl").write_text('{"epoch": 1}\n{"epo')
    assert read(tmp_path / "t.jsonl") == [{"epoch": 1}]


def test_a_resumed_schedule_is_this_runs_at_the_stored_step_and_keeps_adascales_progress():
    from scalesgd.recipe.adascale import AdaScaleFactor
    from scalesgd.recipe.schedule import LrFactor
    from scalesgd.train.checkpoint import resume_schedule

    def scheduler(factor, lr=1.0):
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))]}, {"params": [torch.nn.Parameter(torch.zeros(1))]}]
        return torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(groups, lr=lr), factor)

    old = scheduler(LrFactor(100, 10, warmup="none", schedule="cosine"))
    for _ in range(40):
        old.optimizer.step()
        old.step()
    longer = scheduler(LrFactor(200, 10, warmup="none", schedule="cosine"), lr=2.0)  # resumed with more epochs
    resume_schedule(longer, old.state_dict())
    assert longer.last_epoch == 40 and longer.lr_lambdas[0].total_steps == 200
    assert longer.optimizer.param_groups[0]["lr"] == pytest.approx(2.0 * LrFactor(200, 10, schedule="cosine")(40))

    ada = scheduler(AdaScaleFactor.over(LrFactor(100, 10, warmup="none"), 4.0))
    ada.lr_lambdas[0].gain, ada.lr_lambdas[0].progress = 2.5, 70.0
    again = scheduler(AdaScaleFactor.over(LrFactor(100, 10, warmup="none"), 4.0))
    resume_schedule(again, torch.load(_saved(ada.state_dict()), weights_only=True))
    assert again.lr_lambdas[0] is again.lr_lambdas[1]  # one factor, advanced once per step
    assert (again.lr_lambdas[0].gain, again.lr_lambdas[0].progress) == (2.5, 70.0)


def _saved(state):
    import io
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def full_disk_save(state, f):
    """torch.save on a full disk: part written, then torch's own error raised while handling the OSError."""
    f.write(b"PK\x03\x04 part of a checkpoint")
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None


def test_a_full_disk_while_a_checkpoint_is_written_keeps_the_one_before_and_says_so(tmp_path, monkeypatch):
    path, previous = tmp_path / "checkpoint.pt", tmp_path / "checkpoint.prev.pt"
    save_atomic({"epoch": 1}, path, keep_previous=previous)
    monkeypatch.setattr(checkpoint.torch, "save", full_disk_save)
    with pytest.raises(NoSpace) as err:
        save_atomic({"epoch": 2}, path, keep_previous=previous)
    assert str(err.value) == f"no space left writing checkpoint {path} (previous checkpoint kept)"
    assert torch.load(path, weights_only=True) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # the temporary file is gone


def test_a_full_disk_at_the_first_checkpoint_says_there_is_none_yet(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", full_disk_save)
    with pytest.raises(NoSpace, match=r"\(no checkpoint had been written yet\)"):
        save_atomic({"epoch": 1}, tmp_path / "checkpoint.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_checkpoint_too_big_for_a_real_tmpfs_keeps_the_one_before(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        path = disk / "checkpoint.pt"
        save_atomic({"epoch": 1, "w": torch.zeros(64_000)}, path, keep_previous=disk / "checkpoint.prev.pt")
        with pytest.raises(NoSpace, match=r"\(previous checkpoint kept\)"):
            save_atomic({"epoch": 2, "w": torch.zeros(256_000)}, path, keep_previous=disk / "checkpoint.prev.pt")
        assert torch.load(path, weights_only=True)["epoch"] == 1
        assert [p.name for p in disk.iterdir()] == ["checkpoint.pt"]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_both_checkpoints_torn_is_one_line_naming_each_and_why(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"PK\x03\x04 torn")
    (tmp_path / "checkpoint.prev.pt").write_bytes(b"")
    with pytest.raises(UsageError) as err:
        load_latest(tmp_path, say=True)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"neither checkpoint of {tmp_path} can be read: checkpoint.pt (")
    assert "nor the one before, checkpoint.prev.pt (an empty file); the run cannot be resumed" in line
    assert "PytorchStreamReader failed reading zip archive" in line  # the latest's own reason


def test_a_lone_torn_checkpoint_is_named_as_before(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(UsageError, match=r"checkpoint.pt is not a readable scalesgd checkpoint \(an empty file\)"):
        load_latest(tmp_path)


def _sharded_checkpoint(run_dir, name: str, epoch: int):
    """A checkpoint file naming a shard folder written by torch.distributed.checkpoint (one process)."""
    folder = f"shards-{epoch}-0"
    dcp.save({"model": {"w": torch.arange(4096.0)}}, checkpoint_id=run_dir / folder)
    save_atomic({"model": None, "shards": folder, "optimizer": None, "scheduler": {}, "epoch": epoch,
                      "rng": {}, "config": {}}, run_dir / name)
    return run_dir / folder


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_cut_short_shard_file_resumes_from_the_checkpoint_before_or_is_one_line(tmp_path, capsys):
    before = _sharded_checkpoint(tmp_path, "checkpoint.prev.pt", 1)
    latest = _sharded_checkpoint(tmp_path, "checkpoint.pt", 2)
    assert shards.problem(latest) is None and load_latest(tmp_path)["epoch"] == 2
    shard = next(latest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:1000])  # a disk that filled, a copy cut off
    assert load_latest(tmp_path, say=True)["epoch"] == 1
    said = capsys.readouterr().err
    assert f"its shard file {latest.name}/{shard.name} is cut short (1,000 of its" in said
    assert "resuming from checkpoint.prev.pt, epoch 1" in said and said.count("\n") == 1
    (before / ".metadata").unlink()
    with pytest.raises(UsageError, match=r"neither checkpoint .* can be read: checkpoint.pt \(its shard file .* cut "
                                         r"short .*\), nor the one before, checkpoint.prev.pt \(its shard folder "
                                         r"shards-1-0 has no readable metadata"):
        load_latest(tmp_path)


def test_a_cut_short_rank_file_resumes_from_the_checkpoint_before_or_is_one_line(tmp_path, capsys):
    for name, epoch in (("checkpoint.prev.pt", 1), ("checkpoint.pt", 2)):
        folder = tmp_path / rank_states.folder_name(epoch, 0)
        folder.mkdir()
        for rank in range(2):
            save_atomic({"codec": {"residual": torch.full((4096,), float(rank))}, "replica": None},
                        folder / rank_states.file_name(rank))
        save_atomic({"model": {}, "optimizer": None, "scheduler": {}, "epoch": epoch, "rng": {}, "config": {},
                     "rank_states": folder.name, "ranks": 2}, tmp_path / name)
    assert load_latest(tmp_path)["epoch"] == 2
    cut = tmp_path / "ranks-2-0" / "rank1.pt"
    cut.write_bytes(cut.read_bytes()[:1000])  # a disk that filled, a copy cut off
    assert load_latest(tmp_path, say=True)["epoch"] == 1
    said = capsys.readouterr().err
    assert "its rank file ranks-2-0/rank1.pt is cut short (1,000 bytes)" in said and said.count("\n") == 1
    (tmp_path / "ranks-1-0" / "rank0.pt").unlink()
    with pytest.raises(UsageError, match=r"checkpoint.pt \(its rank file ranks-2-0/rank1.pt is cut short .*\), nor "
                                         r"the one before, checkpoint.prev.pt \(its rank file ranks-1-0/rank0.pt is "
                                         r"missing\)"):
        load_latest(tmp_path)


def test_each_rank_resumes_its_own_state_from_its_file_or_the_old_ranks_mean_or_an_older_checkpoint(tmp_path):
    folder = tmp_path / rank_states.folder_name(1, 0)
    folder.mkdir()
    for rank in range(2):
        save_atomic({"codec": {"residual": torch.full((3,), float(rank))}, "replica": None},
                    folder / rank_states.file_name(rank))
    state = {"rank_states": folder.name, "ranks": 2}
    env = lambda rank, world: DistEnv(rank, world, rank, world, torch.device("cpu"))
    mine = checkpoint.own_states(state, tmp_path, env(1, 2))
    assert torch.equal(mine["codec"]["residual"], torch.full((3,), 1.0)) and mine["replica"] is None
    mean = checkpoint.own_states(state, tmp_path, env(0, 3))  # a new group: what the old ranks owed, owed alike
    assert torch.equal(mean["codec"]["residual"], torch.full((3,), 0.5)) and mean["replica"] is None
    older = {"codec_states": [{"r": 0.0}, {"r": 1.0}], "replica_states": []}  # kept in the checkpoint itself
    assert checkpoint.own_states(older, tmp_path, env(1, 2)) == {"codec": {"r": 1.0}, "replica": None}
    periodic = {"codec_states": [{"periodic": 0}, {"periodic": 1}]}  # before replicas had a slot of their own
    assert checkpoint.own_states(periodic, tmp_path, env(1, 2)) == {"codec": None, "replica": {"periodic": 1}}
