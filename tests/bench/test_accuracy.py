"""`scalesgd bench accuracy`: variants × seeds of real training runs, resumable."""

import json
from pathlib import Path

from scalesgd.bench.accuracy import AccuracyBenchConfig, report
from tests.bench.cli import bench

TINY = ["--", "--workers", "2", "--dataset", "synthetic", "--samples", "256", "--image-size", "8",
        "--model", "resnet8", "--batch-size", "64", "--epochs", "1", "--warmup", "none"]


def summary_times(out: Path) -> dict:
    return {d.name: (d / "summary.json").stat().st_mtime_ns for d in (out / "runs").iterdir()}


def test_every_variant_and_seed_is_trained_and_a_second_call_reuses_them(tmp_path):
    out = tmp_path / "acc"
    proc = bench("accuracy", "--variants", "--codec fp32;--engine scalesgd --codec fp8", "--seeds", "3",
                 "--out", str(out), *TINY)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "accuracy.json").read_text())
    assert [(r["variant"], r["seed"]) for r in record["results"]] == [
        ("--codec fp32", 3), ("--engine scalesgd --codec fp8", 3)]
    configs = [json.loads((Path(r["run_dir"]) / "config.json").read_text()) for r in record["results"]]
    assert [(c["seed"], c["samples"], c["codec"]) for c in configs] == [(3, 256, "fp32"), (3, 256, "fp8")]
    assert all(0 <= r["final_test_acc"] <= 1 for r in record["results"])
    markdown = (out / "accuracy.md").read_text()
    assert "| `--engine scalesgd --codec fp8` |" in markdown
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    stamps = summary_times(out)
    again = bench("accuracy", "--variants", "--codec fp32;--engine scalesgd --codec fp8", "--seeds", "3",
                  "--out", str(out), *TINY)
    assert again.returncode == 0, again.stderr
    assert summary_times(out) == stamps  # nothing was trained again


def test_a_bad_variant_is_one_line_exit_2_before_any_run(tmp_path):
    proc = bench("accuracy", "--variants", "--codec fp32;--codec fp7", "--out", str(tmp_path / "x"), *TINY)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--codec 'fp7' (with --engine ddp) is not known; choose from fp32, fp16, bf16, powersgd, fp8" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_the_bench_owns_seed_and_run_dir(tmp_path):
    proc = bench("accuracy", "--variants", "--codec fp32 --seed 4", "--out", str(tmp_path / "x"), *TINY)
    assert proc.returncode == 2 and "--seed in '--codec fp32 --seed 4': the bench sets it per run" in proc.stderr


def test_language_models_are_compared_by_validation_loss_in_per_cent_of_the_reference(tmp_path):
    cfg = AccuracyBenchConfig(variants=("--codec fp32", "--codec fp8"), seeds=(0, 1, 2), out=str(tmp_path))
    results = [{"variant": v, "seed": s, "final_test_acc": 0.4, "final_test_loss": loss, "final_test_perplexity": 9.0}
               for v, losses in (("--codec fp32", (2.0, 2.1, 1.9)), ("--codec fp8", (2.2, 2.02, 2.3)))
               for s, loss in zip((0, 1, 2), losses)]
    report(cfg, results, "scalesgd bench accuracy")
    record = json.loads((tmp_path / "accuracy.json").read_text())
    assert record["metric"] == "final_test_loss" and record["medians"] == {"--codec fp32": 2.0, "--codec fp8": 2.2}
    row = "| `--codec fp8` | 2.2000 | 2.0200 | 2.3000 | 2.2000 | +10.00 % | +10.00 (-3.81 – +21.05) |"
    assert row in (tmp_path / "accuracy.md").read_text()  # seed by seed: +10 %, −3.81 %, +21.05 %
