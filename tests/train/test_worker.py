"""Workers: a killed one stops the others with one line naming it; under torchrun they join its launch."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from scalesgd.bench.faults import rank_of, workers_of
from scalesgd.train.worker import what_is_kept
from tests.train.cli import FAST, load_ckpt, wait_for_checkpoint


def test_killing_a_worker_stops_the_others_with_one_line_naming_it(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(run), "--workers", "3",
                             "--batch-size", "96", "--epochs", "200", "--warmup-epochs", "1", "--quiet",
                             "--timeout", "30"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoint(run, proc)
        victim = next(pid for pid in workers_of(proc) if rank_of(pid) == 1)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGKILL  # the killed worker's status, as a shell gives it
    assert stopped_after < 30
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["scalesgd: error: worker rank 1 was killed by SIGKILL; the other workers were stopped"]
    assert load_ckpt(run)["epoch"] >= 1  # the last checkpoint survives


def test_joins_a_torchrun_launch_instead_of_spawning(tmp_path):
    run = tmp_path / "run"
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                           "--master-port", str(_free_port()), "-m", "scalesgd", "train", "--run-dir", str(run),
                           "--epochs", "1", "--warmup-epochs", "0", *FAST],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["config"]["workers"] == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(run: Path, *extra: str) -> subprocess.Popen:
    torchrun = Path(sys.executable).with_name("torchrun")
    return subprocess.Popen([str(torchrun), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                             str(_free_port()), *extra, "-m", "scalesgd", "train", "--run-dir", str(run),
                             "--epochs", "2", "--checkpoint-every", "2", *FAST],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))


def test_under_torchrun_max_restarts_a_killed_worker_resumes_from_the_checkpoint(tmp_path):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    proc = _torchrun(broken, "--max-restarts", "1")
    try:
        wait_for_checkpoint(broken, proc)
        victim = next(pid for pid in workers_of(proc) if rank_of(pid) == 1)  # torchrun's workers are its children
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, [line for line in err.splitlines() if "scalesgd" in line or "Error" in line]
    reference = _torchrun(whole)
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err[-2000:]
    a, b = load_ckpt(whole), load_ckpt(broken)
    assert a["epoch"] == b["epoch"] == 2
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_a_stopped_run_says_only_what_exists(tmp_path):
    assert what_is_kept(tmp_path) == "no checkpoint had been written yet"
    assert what_is_kept(None) == "no checkpoint had been written yet"
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    assert what_is_kept(tmp_path) == f"the last good checkpoint is kept in {tmp_path}"
