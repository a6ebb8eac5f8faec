"""`scalesgd compare`: a figure and a table of real runs (fp32 against fp8), a study's runs, and bad input."""

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from scalesgd.cli import main
from scalesgd.train import compare
from tests.train.cli import FAST, scalesgd

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The suite's finished fp32 run (DDP) and an fp8 run of the scalesgd engine, the two trained at once."""
    fp8 = tmp_path_factory.mktemp("compare") / "fp8"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--workers", "2", "--epochs", "2",
                             "--milestones", "2", "--engine", "scalesgd", "--codec", "fp8", "--compress-after", "0",
                             "--run-dir", str(fp8), *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fp32 = request.getfixturevalue("finished_run")
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return fp32, fp8


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def md_rows(out: Path) -> list[dict]:
    """compare.md's table as one dict per row, keyed by column."""
    lines = [line for line in (out / "compare.md").read_text().splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert set(lines[1]) == {"|", "-"}  # the header's rule
    return [dict(zip(cells[0], row)) for row in cells[2:]]


def study_of(tmp_path: Path, runs, names: list[str]) -> Path:
    """A `bench accuracy`/`sweep` output: OUT/runs/NAME, one copy of a run per name (checkpoints left out)."""
    out = tmp_path / "study"
    for name, run in zip(names, runs):
        shutil.copytree(run, out / "runs" / name, ignore=shutil.ignore_patterns("checkpoint*.pt"))
    (out / "accuracy.md").write_text("the study's own table\n")
    return out


def test_compare_writes_one_figure_and_a_row_per_run_with_the_runs_numbers(runs, tmp_path, capsys):
    fp32, fp8 = runs
    out = tmp_path / "new" / "cmp"
    assert main(["compare", str(fp32), str(fp8), "--out", str(out)]) == 0

    png = (out / "compare.png").read_bytes()
    assert png[:8] == PNG and len(png) > 30_000
    width, height = struct.unpack(">II", png[16:24])  # IHDR
    assert width >= 1200 and height >= 900  # a 3 × 2 grid, not a single plot

    rows = md_rows(out)
    assert [r["run"] for r in rows] == [str(fp32), str(fp8)]
    assert [r["codec"] for r in rows] == ["ddp fp32", "scalesgd fp8"]
    for row, run in zip(rows, runs):
        s = summary(run)
        assert row["model"] == s["config"]["model"] == "resnet8"
        assert int(row["global batch"]) == s["config"]["batch_size"] == 128
        assert int(row["workers"]) == s["world_size"] == 2
        assert float(row["final test acc %"]) == pytest.approx(100 * s["final_test_acc"], abs=0.005)
        assert float(row["wall time s"]) == pytest.approx(s["wall_time_s"], abs=0.05)
        speed, unit = row["throughput /s"].split(" ")
        assert float(speed) == pytest.approx(s["images_per_s"], abs=0.5) and unit == "images/s"
    assert rows[0]["sent MB/iter"] == "—"  # DDP's buckets are not counted
    assert float(rows[1]["sent MB/iter"]) * 1e6 == pytest.approx(summary(fp8)["iteration"]["mean_bytes_sent"], rel=1e-2)
    for counter in ("fp8_saturated", "fp8_flushed"):
        assert rows[0][f"mean {counter}"] == "—"
        assert float(rows[1][f"mean {counter}"]) == pytest.approx(summary(fp8)["iteration"][f"mean_{counter}"],
                                                                  rel=1e-2, abs=1e-12)
    shown = capsys.readouterr().out
    assert "2 run(s) compared" in shown and "scalesgd fp8" in shown and str(out / "compare.md") in shown
    assert (fp8 / "report.png").read_bytes()[:8] == PNG  # the single-run report reads through the same reader


def test_labels_name_what_each_run_trained_and_wall_time_ends_at_the_runs_own(runs):
    loaded = [compare.load(run) for run in runs]
    assert compare.labels(loaded) == ["resnet8 · ddp fp32 · batch 128", "resnet8 · scalesgd fp8 · batch 128"]
    for run in loaded:
        clock = compare.wall_clock(run)
        assert len(clock) == len(run.curves.iters) == 24
        assert all(b > a for a, b in zip(clock, clock[1:])) and clock[0] > 0
        assert clock[-1] == pytest.approx(run.summary["wall_time_s"])
    twice = [loaded[1], compare.Compared(Path("elsewhere/fp8"), loaded[1].config, {}, loaded[1].curves)]
    assert compare.labels(twice) == [f"resnet8 · scalesgd fp8 · batch 128 ({loaded[1].path})",
                                     "resnet8 · scalesgd fp8 · batch 128 (elsewhere/fp8)"]


def test_a_study_directory_stands_for_its_runs_in_name_order(runs, tmp_path):
    fp32, fp8 = runs
    study = study_of(tmp_path, [fp8, fp32, fp32], ["codec_fp8-seed10", "codec_fp32-seed2", "codec_fp32-seed10"])
    expected = [study / "runs" / n for n in ("codec_fp8-seed10", "codec_fp32-seed2", "codec_fp32-seed10")]
    assert compare.expand([str(study)]) == expected
    assert compare.expand([str(study / "runs")]) == expected  # the runs/ folder itself
    assert compare.expand([str(expected[2]), str(study)]) == [expected[2], *expected[:2]]  # each run once
    out = tmp_path / "cmp"
    assert main(["compare", str(study), "--out", str(out)]) == 0
    rows = md_rows(out)
    assert [r["run"] for r in rows] == [str(p) for p in expected]
    assert [r["codec"] for r in rows] == ["scalesgd fp8", "ddp fp32", "ddp fp32"]
    assert (out / "compare.png").read_bytes()[:8] == PNG
    names = compare.labels([compare.load(p) for p in expected])
    assert names == ["resnet8 · scalesgd fp8 · batch 128", "resnet8 · ddp fp32 · batch 128 (codec_fp32-seed2)",
                     "resnet8 · ddp fp32 · batch 128 (codec_fp32-seed10)"]  # numbers by value: 8 < 32, 2 < 10


def test_a_run_cut_short_is_compared_from_its_log(runs, tmp_path):
    _, fp8 = runs
    cut = tmp_path / "cut"
    shutil.copytree(fp8, cut, ignore=shutil.ignore_patterns("checkpoint*.pt", "summary.json"))
    records = [json.loads(line) for line in (fp8 / "metrics.jsonl").read_text().splitlines()]
    kept = records[:next(i for i, r in enumerate(records) if r["kind"] == "epoch") + 4]  # into epoch 2
    (cut / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    out = tmp_path / "cmp"
    assert main(["compare", str(cut), "--out", str(out)]) == 0
    [row] = md_rows(out)
    epoch1 = next(r for r in kept if r["kind"] == "epoch")
    assert row["final test acc %"] == f"{100 * epoch1['test_acc']:.2f} (cut short after epoch 1)"
    assert row["wall time s"] == "—" and row["sent MB/iter"] == "—"
    assert float(row["throughput /s"].split()[0]) == pytest.approx(epoch1["images_per_s"], abs=0.5)
    saturated = [r["fp8_saturated"] for r in kept if r["kind"] == "iter"]
    assert float(row["mean fp8_saturated"]) == pytest.approx(sum(saturated) / len(saturated), rel=1e-2, abs=1e-12)
    clock = compare.wall_clock(compare.load(cut))
    assert len(clock) == len(saturated) and all(b > a for a, b in zip(clock, clock[1:]))


@pytest.mark.parametrize("case", ["missing", "empty", "file", "config only", "out is a file"])
def test_bad_input_is_one_line_naming_the_path_and_exit_2(runs, tmp_path, capsys, case):
    fp32, _ = runs
    bad = {"missing": tmp_path / "nope", "empty": tmp_path / "empty", "file": fp32 / "summary.json",
           "config only": tmp_path / "started", "out is a file": fp32 / "config.json"}[case]
    (tmp_path / "empty").mkdir()
    (tmp_path / "started").mkdir()
    shutil.copy(fp32 / "config.json", tmp_path / "started")
    out = tmp_path / "cmp"
    argv = ["compare", str(fp32), "--out", str(bad)] if case == "out is a file" else \
        ["compare", str(fp32), str(bad), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scalesgd: error: ") and str(bad) in err
    assert "Traceback" not in err and not out.exists()  # nothing written
    if case == "config only":
        assert "no metrics.jsonl" in err
    if case == "out is a file":
        assert "--out" in err


def test_the_command_exits_2_with_one_line(tmp_path):
    missing = tmp_path / "no-such-run"
    proc = scalesgd("compare", missing, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"scalesgd: error: {missing} does not exist; expected a "
                                                "`scalesgd train` run directory or a directory of them"]
    assert not (tmp_path / "compare").exists()  # the default --out is not created


def text_run(path: Path, codec: str, losses: list[float]) -> Path:
    """A language model's run directory as `scalesgd train` writes one (two epochs of text)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model": "gpt", "dataset": "text", "codec": codec, "engine": "ddp",
                                                  "batch_size": 32, "workers": 2, "gpt_block": 64}))
    epochs = [{"kind": "epoch", "epoch": e, "iter": 10 * e, "train_loss": loss + 0.1, "train_acc": 0.3,
               "test_loss": loss, "test_acc": 0.4, "test_perplexity": 2.718281828 ** loss, "tokens_per_s": 2048.0,
               "lr": 0.001} for e, loss in enumerate(losses, 1)]
    iters = [{"kind": "iter", "epoch": 1 + i // 10, "iter": i + 1, "lr": 0.001, "loss": 3.0} for i in range(20)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in iters + epochs))
    return path


def test_language_models_are_compared_by_validation_loss_perplexity_and_tokens_per_second(tmp_path):
    runs = [text_run(tmp_path / "fp32", "fp32", [2.5, 2.0]), text_run(tmp_path / "fp8", "fp8", [2.6, 2.1])]
    out = tmp_path / "out"
    assert main(["compare", *map(str, runs), "--out", str(out)]) == 0
    rows = md_rows(out)
    assert "final test acc %" not in rows[0]  # every run is a language model's
    assert [row["final val loss"].split()[0] for row in rows] == ["2.0000", "2.1000"]
    assert rows[1]["perplexity"].split()[0] == f"{2.718281828 ** 2.1:.3f}"
    assert rows[0]["throughput /s"] == "2048 tokens/s"
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
