"""`scalesgd train` end to end: artefacts, exact resume, a killed worker, torchrun."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

FAST = ["--quiet", "--dataset", "digits", "--batch-size", "128", "--base-batch", "32", "--warmup-epochs", "1"]


def scalesgd(*argv, cwd=None, timeout=240, **kw):
    return subprocess.run([sys.executable, "-m", "scalesgd", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, **kw)


def load_ckpt(run: Path) -> dict:
    return torch.load(run / "checkpoint.pt", weights_only=True)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "two-workers"
    proc = scalesgd("train", "--workers", "2", "--epochs", "2", "--milestones", "2", "--run-dir", str(run), *FAST)
    assert proc.returncode == 0, proc.stderr
    return run


def test_two_workers_train_and_write_every_artefact(finished_run):
    run = finished_run
    config = json.loads((run / "config.json").read_text())
    assert config["workers"] == 2 and config["batch_size"] == 128 and config["epochs"] == 2
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    iters = [r for r in records if r["kind"] == "iter"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    steps = 12  # 11 full global batches of 128 and a last one of 29
    assert [r["iter"] for r in iters] == list(range(1, 2 * steps + 1))
    assert set(iters[0]) == {"kind", "epoch", "iter", "lr", "loss"}
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert {"train_loss", "train_acc", "test_loss", "test_acc", "images_per_s"} <= set(epochs[0])
    assert iters[0]["lr"] == pytest.approx(0.1) and iters[steps]["lr"] == pytest.approx(0.4)  # gradual warmup
    assert epochs[-1]["test_acc"] > 0.3  # well above chance (0.1) after two epochs
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_test_acc"] == epochs[-1]["test_acc"]
    assert summary["images_per_s"] > 0 and summary["wall_time_s"] > 0 and summary["config"] == config
    assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = load_ckpt(run)
    assert {"model", "optimizer", "scheduler", "epoch", "rng", "config"} <= set(state)
    assert state["epoch"] == 2 and len(state["rng"]["torch"]) == 2


def test_resume_with_a_conflicting_option_is_refused_and_changes_nothing(finished_run, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(finished_run, run)
    (run / "summary.json").unlink()
    before = (run / "checkpoint.pt").read_bytes()
    proc = scalesgd("train", "--resume", str(run), "--batch-size", "64")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--batch-size 64 differs from the run's 128" in proc.stderr
    proc = scalesgd("train", "--resume", str(run))
    assert proc.returncode == 2 and "already finished all 2 epochs" in proc.stderr
    assert (run / "checkpoint.pt").read_bytes() == before


RESUME_RUN = ["--quiet", "--dataset", "synthetic", "--samples", "3000", "--image-size", "12",
              "--model", "resnet8", "--batch-size", "64", "--epochs", "5", "--warmup-epochs", "1",
              "--schedule", "cosine", "--seed", "7"]


def _wait_for_checkpoint(run: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if (run / "checkpoint.pt").exists():
            return
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint appeared (exit {proc.poll()})")


FP8_RANGES = ["--fp8-period", "7", "--fp8-samples", "64"]  # ranges re-estimated, from samples, within epochs


@pytest.mark.parametrize("engine", [[], ["--engine", "scalesgd", "--codec", "fp16", "--buckets", "growing"],
                                    ["--engine", "scalesgd", "--codec", "fp8", *FP8_RANGES],
                                    ["--codec", "fp8", *FP8_RANGES],
                                    ["--engine", "scalesgd", "--codec", "topk", "--topk-reuse", "3"],
                                    ["--optimizer", "lars", "--weight-decay", "5e-4", "--schedule", "arccot",
                                     "--arccot-epoch", "3", "--label-smoothing", "0.1", "--bn-momentum", "0.05",
                                     "--bn-batch", "8"]],
                         ids=["ddp", "scalesgd-fp16", "scalesgd-fp8", "ddp-fp8-hook", "scalesgd-topk", "lars-arccot"])
def test_interrupted_and_resumed_run_ends_with_the_same_parameters(tmp_path, engine):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run = [*RESUME_RUN, *engine]
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(broken), *run],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for_checkpoint(broken, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # launcher and workers die mid-epoch, as on a lost machine
    proc.wait()
    assert not (broken / "summary.json").exists(), "the run finished before it could be interrupted"
    interrupted_at = load_ckpt(broken)["epoch"]
    assert interrupted_at < 5

    resumed = scalesgd("train", "--resume", str(broken))
    assert resumed.returncode == 0, resumed.stderr
    uninterrupted = scalesgd("train", "--run-dir", str(whole), *run)
    assert uninterrupted.returncode == 0, uninterrupted.stderr

    a, b = load_ckpt(whole), load_ckpt(broken)
    assert a["epoch"] == b["epoch"] == 5
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    lines = lambda run: [(r["kind"], r["iter"], r.get("loss"), r.get("test_acc"))
                         for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert lines(whole) == lines(broken)


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


def _rank_of(pid: int) -> int | None:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"RANK=")]
    return int(ranks[0]) if ranks else None


def test_killing_a_worker_stops_the_others_with_one_line_naming_it(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd", "train", "--run-dir", str(run), "--workers", "3",
                             "--batch-size", "96", "--epochs", "200", "--warmup-epochs", "1", "--quiet",
                             "--timeout", "30"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_checkpoint(run, proc)
        victim = next(pid for pid in _children(proc.pid) if _rank_of(pid) == 1)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1
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
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENGINE_RUN = ["--quiet", "--dataset", "synthetic", "--samples", "1600", "--image-size", "8", "--model", "resnet8",
              "--batch-size", "32", "--epochs", "1", "--warmup-epochs", "0", "--seed", "3"]


def test_scalesgd_engine_matches_ddp_through_the_cli_and_writes_a_trace(tmp_path):
    ddp, ours = tmp_path / "ddp", tmp_path / "ours"
    trace = tmp_path / "trace.json"
    assert scalesgd("train", "--engine", "ddp", "--run-dir", str(ddp), *ENGINE_RUN).returncode == 0
    proc = scalesgd("train", "--engine", "scalesgd", "--algorithm", "ring", "--buckets", "size:0.05",
                    "--trace", str(trace), "--run-dir", str(ours), *ENGINE_RUN)
    assert proc.returncode == 0, proc.stderr
    a, b = load_ckpt(ddp)["model"], load_ckpt(ours)["model"]
    diff = torch.cat([(a[k] - b[k]).flatten().double() for k in a if a[k].is_floating_point()]).norm()
    norm = torch.cat([a[k].flatten().double() for k in a if a[k].is_floating_point()]).norm()
    assert (diff / norm).item() < 1e-5  # 50 iterations

    summary = json.loads((ours / "summary.json").read_text())
    assert summary["steps_per_epoch"] == 50
    parts = summary["iteration"]
    assert {"median_iteration_s", "mean_compute_s", "mean_codec_s", "mean_exposed_comm_s",
            "mean_overlapped_comm_s", "mean_bytes_sent"} <= set(parts)
    assert parts["mean_bytes_sent"] == 2 * (2 - 1) / 2 * 78_042 * 4  # ring: 2(p−1)/p of the fp32 gradient
    events = json.loads(trace.read_text())["traceEvents"]
    spans = {(e["pid"], e["name"]) for e in events if e["ph"] == "X"}
    for rank in (0, 1):
        for name in ("forward", "backward", "encode", "communicate", "decode", "optimizer step"):
            assert (rank, name) in spans
