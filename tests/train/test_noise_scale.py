"""`--noise-scale` through the command line: B_simple on every epoch line, in the summary and in report.png."""

import json
import math

from tests.train.cli import FAST, scalesgd


def test_noise_scale_is_logged_per_epoch_summarised_and_plotted(tmp_path):
    run = tmp_path / "run"
    proc = scalesgd("train", "--run-dir", str(run), "--workers", "2", "--epochs", "2", "--noise-scale",
                    "--engine", "scalesgd", "--codec", "topk", *FAST)
    assert proc.returncode == 0, proc.stderr
    epochs = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "epoch"]
    values = [e["noise_scale"] for e in epochs]
    assert len(values) == 2 and all(v is not None and math.isfinite(v) and v > 0 for v in values), values
    summary = json.loads((run / "summary.json").read_text())
    assert summary["noise_scale"] == values[-1]
    assert (run / "report.png").read_bytes()[:4] == b"\x89PNG"
