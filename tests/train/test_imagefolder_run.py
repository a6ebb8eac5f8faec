"""`scalesgd train --dataset imagefolder`: streamed from files, resumed mid-epoch exactly, bad files named or
skipped."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from scalesgd.data.imagefolder.trees import write_fake_tree
from tests.train.cli import load_ckpt, scalesgd, wait_for_checkpoint

RUN = ["--quiet", "--dataset", "imagefolder", "--image-size", "24", "--model", "resnet8", "--batch-size", "8",
       "--epochs", "2", "--warmup", "none", "--seed", "4", "--loader-workers", "1", "--checkpoint-every", "2",
       "--timeout", "60"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    write_fake_tree(root, 3, 40, (48, 40), val_per_class=2)
    return root


def truncate(path: Path) -> None:
    """Keep the JPEG's header and cut its data: only decoding finds it."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) * 2 // 3])


def test_a_streamed_run_resumed_mid_epoch_ends_as_the_uninterrupted_one_skipping_a_truncated_file(tmp_path, tree):
    data = tmp_path / "data"
    shutil.copytree(tree, data)
    bad = data / "train" / "n00000000" / "n00000000_bad.JPEG"
    bad.write_bytes((data / "train" / "n00000000" / "n00000000_00000.JPEG").read_bytes())
    truncate(bad)
    argv = [*RUN, "--data-dir", str(data), "--skip-bad-images"]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(broken), *argv],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_checkpoint(broken, proc)
    while proc.poll() is None and load_ckpt(broken)["step"] == 0:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the workers and their loader processes
    proc.wait()
    state = load_ckpt(broken)
    assert state["step"] > 0 and state["epoch"] < 2  # killed mid-epoch, past a mid-epoch checkpoint
    resumed = scalesgd("train", "--resume", str(broken))
    assert resumed.returncode == 0, resumed.stderr
    done = scalesgd("train", "--run-dir", str(whole), *argv)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(f"scalesgd: skipped {bad}: cannot be decoded") == 1  # once, though read each epoch
    x, y = load_ckpt(whole), load_ckpt(broken)
    for name, tensor in x["model"].items():
        assert torch.equal(tensor, y["model"][name]), name
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["skipped_images"] == 1 and list(summary["skipped_files"]) == [str(bad)]
    assert summary["iteration"]["mean_data_wait_s"] >= 0 and summary["steps_per_epoch"] == 15  # 121 images, 8 a step
    iters = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert all("data_wait_s" in r for r in iters if r["kind"] == "iter")


def test_a_bad_file_stops_the_run_with_one_line_naming_it(tmp_path, tree):
    data = tmp_path / "data"
    shutil.copytree(tree, data)
    empty = data / "val" / "n00000001" / "empty.JPEG"
    empty.write_bytes(b"")
    proc = scalesgd("train", *RUN, "--data-dir", str(data), "--run-dir", str(tmp_path / "a"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr  # found by the pre-scan
    assert f"scalesgd: error: {empty}: empty file; --skip-bad-images leaves such files out" in proc.stderr
    empty.unlink()
    cut = data / "val" / "n00000002" / "n00000002_00001.JPEG"
    truncate(cut)
    proc = scalesgd("train", *RUN, "--data-dir", str(data), "--run-dir", str(tmp_path / "b"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr  # found by one rank, evaluating
    assert f"scalesgd: error: {cut}: cannot be decoded" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
