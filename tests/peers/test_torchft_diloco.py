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


@pytest.mark.parametrize("bucket_mb, allreduces", [(0, 4), (1.0, 1)])
def test_peer_bucket_mb_sums_torchfts_pseudo_gradients_in_one_allreduce_a_bucket(bucket_mb, allreduces):
    """`--peer-bucket-mb` reaches torchft's DiLoCo: one allreduce for a model within a bucket, else one a tensor."""
    from unittest.mock import create_autospec

    import torch
    from torchft import Manager
    from torchft.local_sgd import DiLoCo

    from scalesgd.peers.torchft_diloco import buckets

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))  # 4 tensors, 26 floats
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = create_autospec(Manager)
    manager._use_async_quorum = False
    manager.should_commit.return_value = True
    manager.current_step.return_value = 0  # the round's fragment: the first
    with DiLoCo(manager, [model], inner, torch.optim.SGD(model.parameters(), lr=0.7), sync_every=2,
                backup_device=torch.device("cpu"), pin_memory=False, **buckets(bucket_mb)):
        for _ in range(2):  # the round ends at the second step
            model(torch.ones(1, 3)).sum().backward()
            inner.step()
    assert manager.allreduce.call_count == allreduces
