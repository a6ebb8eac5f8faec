"""Checkpoints: an interrupted run resumes to exactly the parameters of an uninterrupted one; nothing is lost."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from scalesgd.train.checkpoint import save_atomic
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


RESUME_RUN = ["--quiet", "--dataset", "synthetic", "--samples", "3000", "--image-size", "12",
              "--model", "resnet8", "--batch-size", "64", "--epochs", "5", "--warmup-epochs", "1",
              "--schedule", "cosine", "--seed", "7"]


FP8_RANGES = ["--fp8-period", "7", "--fp8-samples", "64"]  # ranges re-estimated, from samples, within epochs


@pytest.mark.parametrize("engine", [[], ["--engine", "scalesgd", "--codec", "fp16", "--buckets", "growing"],
                                    ["--engine", "scalesgd", "--codec", "fp8", *FP8_RANGES],
                                    ["--codec", "fp8", *FP8_RANGES],
                                    ["--engine", "scalesgd", "--codec", "topk", "--topk-reuse", "3"],
                                    ["--engine", "scalesgd", "--codec", "topk", "--density", "0.05",
                                     "--momentum-correction", "--density-warmup", "2", "--local-clip", "1.0",
                                     "--weight-decay", "5e-4"],
                                    ["--optimizer", "lars", "--weight-decay", "5e-4", "--schedule", "arccot",
                                     "--arccot-epoch", "3", "--label-smoothing", "0.1", "--bn-momentum", "0.05",
                                     "--bn-batch", "8"]],
                         ids=["ddp", "scalesgd-fp16", "scalesgd-fp8", "ddp-fp8-hook", "scalesgd-topk", "scalesgd-topk-dgc",
                              "lars-arccot"])
def test_interrupted_and_resumed_run_ends_with_the_same_parameters(tmp_path, engine):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run = [*RESUME_RUN, *engine]
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(broken), *run],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_checkpoint(broken, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # launcher and workers die mid-epoch, as on a lost machine
    proc.wait()
    assert not (broken / "summary.json").exists(), "the run finished before it could be interrupted"
    interrupted_at = load_ckpt(broken)["epoch"]
    assert interrupted_at < 5

    resumed = scalesgd("train", "--resume", str(broken))
    assert resumed.returncode == 0, resumed.stderr
    uninterrupted = scalesgd("train", "--run-dir", str(whole), *run)
    assert uninterrupted.returncode == 0, uninterrupted.stderr

    a, b = load_ckpt(whole), load_ckpt(broken)
    assert a["epoch"] == b["epoch"] == 5
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    lines = lambda run: [(r["kind"], r["iter"], r.get("loss"), r.get("test_acc"))
                         for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert lines(whole) == lines(broken)


def test_save_is_atomic_and_leaves_nothing_behind_when_writing_fails(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_atomic({"epoch": 1}, path)
    with pytest.raises(Exception):
        save_atomic({"epoch": 2, "bad": lambda: None}, path)  # cannot be pickled: the write fails midway
    assert torch.load(path, weights_only=True) == {"epoch": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
