"""`scalesgd bench faults`: a soak of kills restarts as many times and ends bit-identical to an uninterrupted
run, and the table says so (the other scenarios' promises are tested in tests/runtime and tests/train); the new paths'
faults — a data loader process killed, the image folder gone, a full disk — are each one line naming the cause."""

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalesgd.bench import faults
from scalesgd.bench.faults import FaultsBenchConfig, paths
from scalesgd.data import (
    BadImage,
    GlobalBatchSampler,
    LoaderSettings,
    load_image_folder,
    open_pipeline,
)
from scalesgd.data.imagefolder.trees import write_fake_tree
from scalesgd.data.pipeline import DataGone, FolderPipeline, one_line
from scalesgd.train.worker import named_cause
from tests.command import scalesgd


def test_a_soak_of_two_kills_restarts_twice_and_ends_bit_identical(tmp_path):
    out = tmp_path / "faults"
    proc = scalesgd("bench", "faults", "--scenarios", "soak", "--kills", "2", "--workers", "2", "--timeout", "5",
                    "--seed", "16", "--out", out, timeout=1200)
    results = {r["scenario"]: r for r in json.loads((out / "faults.json").read_text())["results"]}
    assert proc.returncode == 0, [r["outcome"] for r in results.values()]
    soak = results["soak"]
    assert soak["ok"] and "2 restarts" in soak["outcome"] and "bit-identical" in soak["outcome"]
    assert soak["fault"].startswith("2 SIGKILLs")
    assert sorted(p.name for p in out.iterdir()) == ["faults.json", "faults.md"]  # the runs are cleaned up


def test_unknown_scenario_is_one_line():
    proc = scalesgd("bench", "faults", "--scenarios", "flood")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "flood" in proc.stderr


# --- the new paths' pieces: the full scenarios (a run each, and a resume) are `scalesgd bench faults` alone ---

PIPELINE = """
import os, signal, sys, torch
from scalesgd.data import GlobalBatchSampler, LoaderSettings, load_image_folder, open_pipeline
from scalesgd.data.pipeline import loader_death
data = load_image_folder(sys.argv[1], 16)
pipeline = open_pipeline(data, GlobalBatchSampler(len(data.train), 4, 1, 0), 1, LoaderSettings(1, torch.device("cpu")))
steps = pipeline.steps()
next(steps)
loader = pipeline.train._iterator._workers[0].pid
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree") / "tree"
    write_fake_tree(root, 2, 8, (32, 28), val_per_class=1)
    return root


def folder_pipeline(tree: Path, skip_bad: bool = False) -> FolderPipeline:
    """A rank's pipeline over `tree`, decoding in this process (no loader processes)."""
    data = load_image_folder(tree, 16, skip_bad=skip_bad)
    return open_pipeline(data, GlobalBatchSampler(len(data.train), 4, 1, 0), 1,
                         LoaderSettings(0, torch.device("cpu"), skip_bad=skip_bad))


def test_a_killed_loader_process_is_one_line_naming_it(tree):
    script = PIPELINE + """
try:
    os.kill(loader, signal.SIGKILL)
    for _ in steps:
        pass
except RuntimeError as err:  # torch's own, or ours where the socket's end came first
    print(loader, loader_death(err))
"""
    proc = subprocess.run([sys.executable, "-c", script, str(tree)], capture_output=True, text=True, timeout=120,
                          check=False)
    pid, said = proc.stdout.strip().split(" ", 1)
    assert said == f"data loader process (pid {pid}) was killed by SIGKILL", proc.stderr


def test_a_loader_process_ends_with_its_training_process(tree):
    script = PIPELINE + "print(loader, flush=True)\nos._exit(1)  # as a worker killed mid-epoch ends\n"
    proc = subprocess.run([sys.executable, "-c", script, str(tree)], capture_output=True, text=True, timeout=120,
                          check=False)
    loader = int(proc.stdout)
    # torch's loader would notice only at its next check of its parent, 5 s on, reading for nobody meanwhile
    assert faults._until(lambda: not faults.alive(loader), 2.0)


@pytest.mark.parametrize("message, said", [
    ("DataLoader worker (pid 12) is killed by signal: Killed. ", "data loader process (pid 12) was killed by SIGKILL"),
    ("DataLoader worker (pid(s) 12, 13) exited unexpectedly", "data loader process (pid 12, 13) exited unexpectedly"),
    (("DataLoader worker (pid 12) exited unexpectedly with exit code 1. Details are lost due to multiprocessing. "
      "Rerunning with num_workers=0 may give better error trace."), "data loader process (pid 12) exited with status 1"),
])
def test_torchs_words_for_a_dead_loader_process_are_one_line_naming_the_rank(message, said):
    assert named_cause(RuntimeError(message), 1, Path("/run")) == f"worker rank 1's {said}"
    assert named_cause(RuntimeError("CUDA error: out of memory"), 1, Path("/run")) is None  # a traceback, as before


def test_a_full_disk_elsewhere_in_the_run_directory_is_named_too():
    err = OSError(errno.ENOSPC, "No space left on device", "/run/metrics.jsonl")
    assert named_cause(err, 0, Path("/run")) == "no space left on the device writing /run/metrics.jsonl"


@pytest.mark.parametrize("skip_bad", [False, True])
def test_an_image_folder_renamed_mid_run_is_named_as_gone(tree, tmp_path, skip_bad):
    data = tmp_path / "data"
    shutil.copytree(tree, data)
    steps = folder_pipeline(data, skip_bad).steps()
    next(steps)
    data.rename(tmp_path / "elsewhere")
    with pytest.raises(DataGone, match=f"^{data} is gone \\(removed or renamed while the run read it\\)$"):
        next(steps)


def test_a_file_of_the_folder_deleted_is_gone_and_with_skip_bad_images_skipped(tree, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(tree, data)
    strict, skipping = folder_pipeline(data), folder_pipeline(data, skip_bad=True)  # both listed it
    victim = next((data / "train" / "n00000001").iterdir())
    victim.unlink()
    with pytest.raises(DataGone, match=f"^{victim} is gone"):
        list(strict.steps())
    assert len(list(skipping.steps())) == 4  # 16 images, 4 a step: one substituted
    assert f"scalesgd: skipped {victim}: cannot be decoded" in capsys.readouterr().err


def test_an_error_a_loader_process_raised_comes_back_as_its_own_line():
    raised = BadImage("Caught BadImage in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
                      '  File "files.py", line 71, in __getitem__\n'
                      "scalesgd.data.imagefolder.scan.BadImage: 16 files in a row from /d/x.JPEG cannot be decoded")
    again = one_line(raised)
    assert type(again) is BadImage and str(again) == "16 files in a row from /d/x.JPEG cannot be decoded"


def test_scenarios_that_need_root_are_skipped_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(paths.os, "geteuid", lambda: 1000)  # where the skip asks
    cfg = FaultsBenchConfig(scenarios=("disk-full", "link-flap", "link-down"), out=str(tmp_path))
    assert faults.run(cfg, "scalesgd bench faults") == 0
    results = json.loads((tmp_path / "faults.json").read_text())["results"]
    assert [r["outcome"] for r in results] == ["skipped: needs root"] * 3
    assert (tmp_path / "faults.md").read_text().count("| skipped: needs root | skipped |") == 3
