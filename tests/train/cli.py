"""Running `scalesgd train` as a user would, for the training tests."""

import subprocess
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.command import scalesgd  # noqa: F401  (the training tests run commands through it)

FAST = ["--quiet", "--dataset", "digits", "--batch-size", "128", "--base-batch", "32", "--warmup-epochs", "1"]


def load_ckpt(run: Path) -> dict:
    """A run's latest checkpoint; a sharded run's whole model read from the shard folder it names."""
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    if state.get("shards"):
        whole = run / "whole.pt"
        dcp_to_torch_save(run / state["shards"], whole)  # as a user exports a sharded run's model
        state["model"] = torch.load(whole, weights_only=True)["model"]
        whole.unlink()
    return state


def wait_for_checkpoint(run: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if (run / "checkpoint.pt").exists():
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint appeared (exit {proc.poll()})")
