"""Running `scalesgd train` as a user would, for the training tests."""

import subprocess
import sys
import time
from pathlib import Path

import torch

FAST = ["--quiet", "--dataset", "digits", "--batch-size", "128", "--base-batch", "32", "--warmup-epochs", "1"]


def scalesgd(*argv, cwd=None, timeout=240, **kw):
    return subprocess.run([sys.executable, "-m", "scalesgd", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, **kw)


def load_ckpt(run: Path) -> dict:
    return torch.load(run / "checkpoint.pt", weights_only=True)


def wait_for_checkpoint(run: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if (run / "checkpoint.pt").exists():
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint appeared (exit {proc.poll()})")
