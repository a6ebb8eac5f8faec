"""`scalesgd train --planner`: the profile, the plan every rank uses, predicted against measured."""

import json

import pytest

from scalesgd.comm.cost import planner
from scalesgd.comm.cost.profile import Profile
from tests.command import scalesgd


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
    summary = json.loads((run / "summary.json").read_text())
    reported = summary["planner"]
    assert reported["groups"] == len(saved["groups"])
    # predicted: the timing model's iteration for the saved profile and groups
    model = planner.predicted(Profile.from_dict(saved["profile"]), saved["groups"])
    assert reported["predicted_iteration_s"] == saved["predicted_iteration_s"] == pytest.approx(model)
    # measured: the median step's compute and exposed exchange, a part of each step, so within the median step
    assert 0 < reported["measured_iteration_s"] <= summary["iteration"]["median_iteration_s"]
    shown = scalesgd("profile", str(run))
    assert shown.returncode == 0, shown.stderr
    assert f"{len(saved['groups'])} groups; predicted iteration" in shown.stdout


def test_planner_needs_the_topk_codec():
    proc = scalesgd("train", *TINY[:4], "--codec", "fp16", "--planner", "dlgs")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--planner dlgs plans the groups of --codec topk" in proc.stderr
