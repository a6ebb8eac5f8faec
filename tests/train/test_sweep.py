"""`scalesgd sweep`: the batch × rule × warmup grid of real training runs, resumable, with its report."""

import json
import subprocess
from pathlib import Path

import pytest

from scalesgd.cli import main
from scalesgd.train.sweep import (
    Point,
    Scale,
    SweepConfig,
    best_rates,
    grid,
    limits,
    median_errors,
    noise_at_smallest,
    run_name,
)
from tests.command import scalesgd

TINY = ["--", "--workers", "2", "--dataset", "synthetic", "--samples", "256", "--image-size", "8",
        "--model", "resnet8", "--base-batch", "16", "--epochs", "2", "--warmup-epochs", "1"]


def sweep(*argv: str) -> subprocess.CompletedProcess:
    return scalesgd("sweep", *argv, timeout=600)


def test_grid_runs_each_recipe_from_the_smallest_batch_up():
    cfg = SweepConfig(batches=(64, 16), rules=("linear", "sqrt"), warmups=("gradual",), optimizers=("sgd", "lars"),
                      seeds=(0, 1))
    points = grid(cfg)
    assert len(points) == 2 * 2 * 2 * 2
    assert [p.batch for p in points[:4]] == [16, 16, 64, 64]
    assert len({p.dirname for p in points}) == len(points)
    assert points[0].argv(("--epochs", "3")) == ["--epochs", "3", "--batch-size", "16", "--lr-scaling", "linear",
                                                 "--warmup", "gradual", "--seed", "0", "--optimizer", "sgd",
                                                 "--noise-scale"]  # 2 workers by default: the noise is measured
    rated = grid(SweepConfig(batches=(16,), base_lrs=(0.05, 0.2), train_args=("--workers", "1")))
    assert [p.recipe for p in rated] == ["linear scaling · gradual warmup · η₀ 0.05",
                                         "linear scaling · gradual warmup · η₀ 0.2"]
    assert rated[1].argv(()) == ["--batch-size", "16", "--lr-scaling", "linear", "--warmup", "gradual", "--seed", "0",
                                 "--base-lr", "0.2"]  # one worker: no noise scale to measure


def test_the_limit_is_the_largest_batch_within_a_point_and_the_noise_scale_sits_beside_it():
    errors = {"a": {16: 0.100, 32: 0.105, 64: 0.1095, 128: 0.125, 256: 0.108},  # 256 is back within: the largest
              "b": {16: 0.100, 32: 0.150, 64: 0.200}}
    assert limits(errors) == {"a": 256, "b": 16}
    results = [{"recipe": "a", "batch": 16, "noise_scale": v, "noise_scale_average": v / 2} for v in (40.0, 60.0, 50.0)]
    results += [{"recipe": "a", "batch": 32, "noise_scale": 900.0, "noise_scale_average": 800.0},
                {"recipe": "b", "batch": 16, "noise_scale": None, "noise_scale_average": None}]
    assert noise_at_smallest(results) == {"a": 25.0, "b": None}  # the run averages' median
    assert noise_at_smallest(results, "noise_scale") == {"a": 50.0, "b": None}  # the medians over epochs'



def test_the_rate_search_names_each_familys_best_rate_per_batch():
    points = grid(SweepConfig(batches=(16, 32), base_lrs=(0.1, 0.05), seeds=(0, 1), train_args=("--workers", "1")))
    assert {p.family for p in points} == {"linear scaling · gradual warmup"}
    error = {(16, 0.1): (0.10, 0.30), (16, 0.05): (0.20, 0.20), (32, 0.1): (0.30, 0.10), (32, 0.05): (0.40, 0.50)}
    results = [{"recipe": p.recipe, "family": p.family, "batch": p.batch, "base_lr": p.base_lr,
                "final_test_error": error[p.batch, p.base_lr][p.seed]} for p in points]
    errors = median_errors(results)
    # at 16 both rates' medians tie at 0.2: the smaller rate wins; at 32, 0.1's median 0.2 beats 0.05's 0.45
    assert best_rates(errors, results) == {"linear scaling · gradual warmup": {16: 0.05, 32: 0.1}}
    assert best_rates(errors, [{**r, "base_lr": None} for r in results]) == {}  # no search, no rates


def test_median_errors_per_recipe_and_batch():
    results = [{"recipe": "a", "batch": 16, "final_test_error": e} for e in (0.1, 0.3, 0.2)]
    results += [{"recipe": "a", "batch": 32, "final_test_error": 0.5}]
    assert median_errors(results) == {"a": {16: 0.2, 32: 0.5}}


def test_every_point_is_trained_with_its_rule_and_warmup_and_a_second_call_trains_nothing(tmp_path):
    out = tmp_path / "sweep"
    argv = ["--batches", "32,16", "--rules", "linear", "--warmups", "gradual,none", "--out", str(out), *TINY]
    proc = sweep(*argv)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "sweep.json").read_text())
    assert [(r["batch"], r["recipe"]) for r in record["results"]] == [
        (16, "linear scaling · gradual warmup"), (32, "linear scaling · gradual warmup"),
        (16, "linear scaling · no warmup"), (32, "linear scaling · no warmup")]
    for r in record["results"]:
        cfg = json.loads((Path(r["run_dir"]) / "config.json").read_text())
        assert (cfg["batch_size"], cfg["lr_scaling"]) == (r["batch"], "linear")
        if r["batch"] != 16:  # the base batch's run is shared by both warmups
            assert r["recipe"] == {"gradual": "linear scaling · gradual warmup",
                                   "none": "linear scaling · no warmup"}[cfg["warmup"]]
        assert r["peak_lr"] == pytest.approx(0.1 * r["batch"] / 16)  # the linear rule
        assert [c["epoch"] for c in r["curve"]] == [1, 2] and r["epochs_trained"] == 2
        assert 0 <= r["final_test_error"] <= 1
    table = (out / "sweep.md").read_text()
    assert "| linear scaling · no warmup |" in table and "16 error % (Δ)" in table
    assert "limit (≤ 1 point)" in table and "noise scale at 16" in table
    assert any((r["noise_scale"] or 0) > 0 for r in record["results"])  # measured (None: noise swamped |G|²)
    assert any((r["noise_scale_average"] or 0) > 0 for r in record["results"])
    assert "median of epochs" in table and set(record["noise_scale_average_at_smallest"]) == set(record["limit"])
    for png in ("sweep.png", "curves.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    stamps = {d.name: (d / "summary.json").stat().st_mtime_ns for d in (out / "runs").iterdir()}
    assert len(stamps) == 3  # the base batch (16) is one run for both warmups
    again = sweep(*argv)
    assert again.returncode == 0, again.stderr
    assert {d.name: (d / "summary.json").stat().st_mtime_ns for d in (out / "runs").iterdir()} == stamps


@pytest.mark.parametrize("argv,expected", [
    (["--rules", "cube"], "--rules 'cube' is not known; choose from linear, sqrt, none"),
    (["--warmups", "gradual,gradual"], "--warmups gradual,gradual: give each value once"),
    (["--batches", "16,25"], "batch 25 · linear scaling · gradual warmup · seed 0: --batch-size 25 does not "
                             "divide evenly by --workers 2"),
    (["--", "--batch-size", "64"], "--batch-size after --: the sweep sets it for each run"),
    (["--optimizers", "lars", "--", "--optimizer", "sgd"], "--optimizer after --: the sweep sets it"),
])
def test_bad_input_is_one_line_exit_2_before_any_run(tmp_path, capsys, argv, expected):
    out = tmp_path / "x"
    rest = argv if "--" in argv else [*argv, "--", "--workers", "2", "--dataset", "synthetic"]
    code = main(["sweep", "--out", str(out), *rest])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert expected in err
    assert not out.exists()


def test_point_labels_name_every_choice():
    p = Point(512, "sqrt", "constant", "lars", "arccot", 2)
    assert p.label == "batch 512 · sqrt scaling · constant warmup · lars · arccot · seed 2"
    assert p.dirname == "b512-sqrt-constant-lars-arccot-seed2"
    assert Point(64, "none", "none", None, None, 0).recipe == "no scaling · no warmup"


def test_points_at_the_base_batch_share_one_run_whatever_the_rule_and_warmup():
    a, b = Point(16, "sqrt", "gradual", None, None, 0), Point(16, "linear", "constant", None, None, 0)
    assert run_name(a, 16) == run_name(b, 16)
    assert run_name(a, 8) != run_name(b, 8)
    assert run_name(Point(16, "sqrt", "gradual", "lars", None, 0), 16) != run_name(a, 16)


def test_a_language_models_sweep_reads_validation_loss_and_its_limit_is_relative():
    errors = {"a": {16: 2.00, 32: 2.015, 64: 2.05}}
    assert limits(errors, Scale(loss=True)) == {"a": 32}  # within 1 % of the smallest batch's 2.00 nats
    assert limits(errors) == {"a": 16}  # read as error fractions, 1.5 points is beyond 1 point
    assert Scale.of([{"metric": "loss"}]).loss and not Scale.of([{}]).loss
