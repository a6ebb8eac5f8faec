"""torchft's Streaming DiLoCo, run in our loop as a peer, takes exactly the steps ours takes on an fp32 wire."""

import json

import pytest

from tests.train.cli import FAST, scalesgd

pytest.importorskip("torchft")

STREAMING = ["--local-steps", "4", "--fragments", "2", "--overlap-steps", "1", "--mix", "0.5", "--outer-momentum",
             "0.5", "--workers", "2", "--epochs", "1", "--samples", "1536"]


def losses(run) -> list[tuple[int, float]]:
    return [(r["iter"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "iter"]


def test_torchft_streaming_diloco_takes_the_same_steps_as_ours(tmp_path):
    """Fragments landing on the same schedule, overlapped by τ, mixed by α, outer Nesterov SGD: every logged loss
    (the mean over workers of their local models') is bit-identical, so both implement the same update."""
    for peer, run in (("torchft", tmp_path / "torchft"), ("", tmp_path / "ours")):
        proc = scalesgd("train", *FAST, *STREAMING, "--peer", peer, "--run-dir", str(run))
        assert proc.returncode == 0, proc.stderr[-2000:]
    theirs, ours = losses(tmp_path / "torchft"), losses(tmp_path / "ours")
    assert len(ours) == 12 and theirs == ours
    assert ours[-1][1] < ours[0][1] - 0.1  # and it learns
    again = scalesgd("train", "--resume", str(tmp_path / "torchft"))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "does not resume" in again.stderr
