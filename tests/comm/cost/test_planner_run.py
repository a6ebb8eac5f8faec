"""`scalesgd train --planner`: the profile, the plan every rank uses, predicted against measured."""

import json
import subprocess
import sys

import pytest

from scalesgd.comm.cost import planner
from scalesgd.errors import UsageError


def scalesgd(*argv):
    return subprocess.run([sys.executable, "-m", "scalesgd", *argv], capture_output=True, text=True, timeout=300)


TINY = ["--workers", "2", "--engine", "scalesgd", "--codec", "topk", "--density", "0.1", "--dataset", "synthetic",
        "--samples", "512", "--image-size", "8", "--model", "resnet8", "--batch-size", "64", "--epochs", "1",
        "--warmup", "none", "--quiet"]


def test_a_planned_run_saves_its_profile_uses_its_groups_and_reports_the_prediction(tmp_path):
    run = tmp_path / "run"
    proc = scalesgd("train", *TINY, "--planner", "optimal", "--run-dir", str(run))
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((run / "profile.json").read_text())
    layers = len(saved["profile"]["sizes"])
    assert [i for g in saved["groups"] for i in g] == list(range(layers - 1, -1, -1))
    best_other = min(saved["predicted_unmerged_s"], saved["predicted_single_group_s"])
    assert saved["predicted_iteration_s"] <= best_other + 1e-12
    buckets = json.loads((run / "buckets.json").read_text())
    assert buckets["spec"] == "planner:optimal"
    assert [len(b["tensors"]) for b in buckets["buckets"]] == [len(g) for g in saved["groups"]]
    planner = json.loads((run / "summary.json").read_text())["planner"]
    assert planner["groups"] == len(saved["groups"])
    assert planner["predicted_iteration_s"] > 0 and planner["measured_iteration_s"] > 0
    shown = scalesgd("profile", str(run))
    assert shown.returncode == 0, shown.stderr
    assert f"{len(saved['groups'])} groups; predicted iteration" in shown.stdout


def test_planner_needs_the_topk_codec():
    proc = scalesgd("train", *TINY[:4], "--codec", "fp16", "--planner", "dlgs")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--planner dlgs plans the groups of --codec topk" in proc.stderr


def test_profile_of_a_run_without_one_is_one_line(tmp_path):
    proc = scalesgd("profile", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no profile.json" in proc.stderr


def test_a_file_that_is_not_a_profile_is_refused_before_anything_is_printed(tmp_path, capsys):
    prof = {"t_f": 0.01, "world_size": 2, "density": 0.1, "reuse": 10, "sizes": [10, 20], "names": ["a", "b"],
            "t_b": [0.001, 0.002], "comm": [1e-4, 1e-9], "sparsify": [1e-5, 1e-9]}
    saved = {"profile": prof, "groups": [[1]], "predicted_iteration_s": 0.1, "predicted_unmerged_s": 0.2,
             "predicted_single_group_s": 0.3}
    (tmp_path / "profile.json").write_text(json.dumps(saved))
    with pytest.raises(UsageError, match=r"profile.json is not a profile \(no entry 0\)"):
        planner.show_profile(planner.ProfileCommand(str(tmp_path)))  # layer 0 is in no group
    assert capsys.readouterr().out == ""
    (tmp_path / "profile.json").write_text(json.dumps(saved | {"groups": [[1, 0]]}))
    planner.show_profile(planner.ProfileCommand(str(tmp_path)))
    assert "1 groups; predicted iteration 100.0 ms" in capsys.readouterr().out
