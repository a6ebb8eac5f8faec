"""A non-finite loss stops every rank together and keeps the last good checkpoint."""

import math
from pathlib import Path

import torch

from scalesgd.config import TrainConfig
from scalesgd.errors import NonFiniteLoss
from tests.spawn_util import run_workers


def train_until_nan(rank, world, run_dir):
    """Train with a gradient that turns to NaN from the second epoch on."""
    import scalesgd.train.loop as loop
    from scalesgd.train.distributed import DistEnv

    cfg = TrainConfig(workers=world, epochs=3, warmup_epochs=0, batch_size=256, quiet=True, run_dir=run_dir)
    steps = {"n": 0}
    real = loop.global_batch_loss

    def poisoned(loss_sum, world_size, count):
        steps["n"] += 1
        loss = real(loss_sum, world_size, count)
        return loss * math.nan if steps["n"] > 6 else loss  # 6 steps = one epoch of 1437 / 256

    loop.global_batch_loss = poisoned
    env = DistEnv(rank, world, rank, world, torch.device("cpu"))
    try:
        loop.train(cfg, Path(run_dir), env)
    except NonFiniteLoss as err:
        return str(err)
    return None


def test_non_finite_loss_stops_all_ranks_and_keeps_last_good_checkpoint(tmp_path):
    messages = run_workers(train_until_nan, 2, str(tmp_path))
    assert messages[0] is not None and messages[0] == messages[1]
    assert "loss became nan at epoch 2" in messages[0]
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())
    assert not (tmp_path / "summary.json").exists()

