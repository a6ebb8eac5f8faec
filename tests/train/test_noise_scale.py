"""`--noise-scale` through the command line: B_simple on every epoch line, in the summary and in report.png."""

import json
import math

import pytest

from tests.train.cli import FAST, scalesgd


def test_noise_scale_is_logged_per_epoch_summarised_and_plotted(tmp_path):
    run = tmp_path / "run"
    proc = scalesgd("train", "--run-dir", str(run), "--workers", "2", "--epochs", "2", "--noise-scale",
                    "--engine", "scalesgd", "--codec", "topk", *FAST)
    assert proc.returncode == 0, proc.stderr
    epochs = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]
    values = [e["noise_scale"] for e in epochs]
    assert len(values) == 2 and all(v is not None and math.isfinite(v) and v > 0 for v in values), values
    averages = [e["noise_scale_average"] for e in epochs]  # the run so far: the ratio of its summed estimates
    assert all(v is not None and math.isfinite(v) and v > 0 for v in averages), averages
    summary = json.loads((run / "summary.json").read_text())
    assert summary["noise_scale"] == values[-1] and summary["noise_scale_average"] == averages[-1]
    assert (run / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_adascale_trains_at_the_measured_gain_without_warmup(tmp_path):
    run = tmp_path / "run"
    proc = scalesgd("train", "--run-dir", str(run), "--workers", "2", "--epochs", "2", "--lr-scaling", "adascale",
                    "--schedule", "cosine", *FAST)
    assert proc.returncode == 0, proc.stderr
    records = list(map(json.loads, (run / "metrics.jsonl").read_text().splitlines()))
    iters = [r for r in records if r["kind"] == "iter"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    base_lr, scale = 0.1, 128 / 32  # FAST: --batch-size 128 --base-batch 32, the default base rate
    assert iters[0]["lr"] == pytest.approx(base_lr)  # gain 1 before anything is measured: no warmup to tune
    assert all(0 < r["lr"] <= base_lr * scale for r in iters)
    gains = [e["adascale_gain"] for e in epochs]
    assert all(1.0 <= g <= scale for g in gains) and max(gains) > 1.0
    progress = [e["scale_invariant_epochs"] for e in epochs]
    assert 0 < progress[0] < progress[1] and progress == sorted(progress)
    # as the paper's loop, it trains on past --epochs 2 until the base schedule is done, and stops at the step that
    # finishes it: one step moves τ by at most S base steps (steps_per_epoch × S of them make a base epoch)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 2 and 2 < summary["epochs_trained"] == len(epochs) <= 2 * scale
    assert progress[-2] < 2 <= progress[-1] < 2 + 1 / summary["steps_per_epoch"]
    assert epochs[-1]["test_acc"] > 0.3
