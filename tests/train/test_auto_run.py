"""`scalesgd train --exchange auto`: the decision saved, used, shown against what was measured, kept on resume."""

import json
import os
import signal
import subprocess
import sys

from scalesgd.train.auto_rank import FINALIST_MARGIN
from tests.comm.cost.test_planner_run import scalesgd
from tests.train.cli import wait_for_checkpoint

AUTO_CODECS = ("fp32", "fp16", "bf16")
AUTO = ["--workers", "2", "--engine", "scalesgd", "--exchange", "auto", "--auto-codecs", ",".join(AUTO_CODECS),
        "--dataset", "synthetic", "--samples", "1500", "--image-size", "12", "--model", "resnet8", "--batch-size",
        "64", "--epochs", "3", "--warmup", "none", "--quiet"]


def test_auto_saves_its_decision_trains_with_it_and_keeps_it_on_resume(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", *AUTO, "--run-dir", str(run)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_checkpoint(run, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    decided = json.loads((run / "auto.json").read_text())
    assert decided["codec"] in ("fp32", "fp16", "bf16") and len(decided["candidates"]) == 3 * 4
    assert decided["compresses"] == (decided["codec"] != "fp32")  # and says so when it sends fp32
    finalists = decided["finalists"]
    predicted = {c: min(r["to_target_s"] for r in decided["candidates"] if r["exchange"] == c and not r["missed"])
                 for c in AUTO_CODECS}
    best = finalists[0]["to_target_s"]  # per DDP step to the target
    close = {c for c, s in predicted.items() if s <= best * (1 + FINALIST_MARGIN)}
    assert {f["exchange"] for f in finalists} == close  # every codec the model cannot rank apart is tried
    if len(finalists) > 1:  # tried for real: the one measured soonest to the target (its step × steps factor) is used
        fastest = min(finalists, key=lambda f: f["measured_s"] * (f.get("steps_factor") or 1.0))
        assert (decided["codec"], decided["buckets"], decided["trial_s"]) == (
            fastest["exchange"], fastest["plan"], fastest["measured_s"])
    else:
        assert (decided["codec"], decided["buckets"]) == (finalists[0]["exchange"], finalists[0]["plan"])
    marked = {**decided, "chosen": {**decided["chosen"], "iteration_s": -1.0}}  # marks the saved decision
    (run / "auto.json").write_text(json.dumps(marked))
    resumed = scalesgd("train", "--resume", str(run), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    buckets = json.loads((run / "buckets.json").read_text())
    assert buckets["spec"] == f"auto:{decided['buckets']}"
    assert [len(b["tensors"]) for b in buckets["buckets"]] == [len(g) for g in decided["groups"]]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["auto"]["predicted_s"] == -1.0  # decided once: the resumed run used the saved choice
    assert summary["auto"]["codec"] == decided["codec"] and summary["auto"]["measured_iteration_s"] > 0
    assert summary["config"]["exchange"] == "auto"


def test_auto_weighs_only_exchanges_it_can_run_here():
    proc = scalesgd("train", *AUTO, "--auto-codecs", "fp16,powersgd")  # PyTorch's hook is ddp-powersgd
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--auto-codecs 'powersgd' is not known; choose from fp32," in proc.stderr and "ddp-powersgd" in proc.stderr
    proc = scalesgd("train", *AUTO, "--auto-codecs", "fp16,ddp-onebit")
    assert proc.returncode == 2 and "--auto-codecs ddp-onebit: the simulator has no cost model" in proc.stderr
