"""Another number of workers continues the run, owing what the old ones did. (A run killed past a mid-epoch checkpoint
resumes exactly: tests/train/test_checkpoint.py; restarts after kills, ending bit-identical: tests/bench/test_faults.py,
the soak.)"""

import json
from pathlib import Path

import torch

from scalesgd.train.checkpoint import mean_state
from tests.train.cli import load_ckpt, scalesgd

RUN = ["--quiet", "--dataset", "synthetic", "--samples", "1200", "--image-size", "12", "--model", "resnet8",
       "--batch-size", "96", "--epochs", "4", "--warmup-epochs", "1", "--seed", "3", "--engine", "scalesgd",
       "--codec", "topk", "--density", "0.05", "--checkpoint-every", "4", "--timeout", "30"]


def _same_parameters(a: Path, b: Path) -> None:
    x, y = load_ckpt(a), load_ckpt(b)
    assert x["epoch"] == y["epoch"]
    for name, tensor in x["model"].items():
        assert torch.equal(tensor, y["model"][name]), name


def _epoch_records(run: Path) -> list[tuple]:
    return [(r["epoch"], r["train_loss"], r["test_acc"]) for r in map(json.loads, (run / "metrics.jsonl")
                                                                      .read_text().splitlines()) if r["kind"] == "epoch"]


def test_resume_on_fewer_and_on_more_workers_continues_with_a_warning(tmp_path):
    run = tmp_path / "run"
    short = [*RUN[:RUN.index("--epochs")], "--epochs", "2", *RUN[RUN.index("--epochs") + 2:], "--samples", "600"]
    assert scalesgd("train", "--run-dir", str(run), "--workers", "3", *short).returncode == 0
    for workers, epochs in (("2", "3"), ("3", "4")):
        proc = scalesgd("train", "--resume", str(run), "--workers", workers, "--epochs", epochs)
        assert proc.returncode == 0, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and f"--workers {workers} (was" in lines[0] and f"--epochs {epochs} (was" in lines[0]
        assert "no longer exactly" in lines[0]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["world_size"] == int(workers) and summary["epochs"] == int(epochs)
    records = _epoch_records(run)
    assert [e for e, *_ in records] == [1, 2, 3, 4]
    assert records[-1][1] < records[0][1]  # it kept learning across both changes
    fewer = scalesgd("train", "--resume", str(run), "--epochs", "3")
    assert fewer.returncode == 2 and "fewer than the run's 4" in fewer.stderr


def test_old_ranks_residuals_are_owed_in_full_by_the_new_ranks():
    g = torch.Generator().manual_seed(0)
    old = [{"buckets": {0: {"residual": torch.randn(50, generator=g), "momentum": None,
                            "threshold": float(r), "density": 0.01, "step": 7}}} for r in range(4)]
    for world in (2, 3, 5):
        new = [mean_state(old)] * world
        owed_before = torch.stack([s["buckets"][0]["residual"] for s in old]).mean(0)
        owed_after = torch.stack([s["buckets"][0]["residual"] for s in new]).mean(0)
        torch.testing.assert_close(owed_after, owed_before)
        assert new[0]["buckets"][0]["step"] == 7 and new[0]["buckets"][0]["momentum"] is None
        assert new[0]["buckets"][0]["threshold"] == 1.5
