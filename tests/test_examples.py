"""The examples run as a user runs them (torchrun, Lightning's own launcher, Accelerate under torchrun) on 2 gloo
processes, a transformer trainer of the usual kind among them: the model learns, the hook's bytes are what the codec
sends for every parameter, and a resumed Lightning run ends with exactly the parameters of an uninterrupted one."""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from scalesgd.comm.wire.compact import BLOCK
from tests.spawn_util import _free_port

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HANG_S = 300  # an example takes 10–50 s


def run(args, tmp_path, launcher="torchrun"):
    """Run an example; the JSON line rank 0 prints last. One that hangs fails with every process's Python stack
    (faulthandler, on SIGABRT) rather than a bare timeout."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONFAULTHANDLER": "1"}
    head = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
             "--master-port", env["MASTER_PORT"]] if launcher == "torchrun" else [sys.executable])
    proc = subprocess.Popen(head + [str(EXAMPLES / args[0]), *args[1:]], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        for pid in [*descendants(proc.pid), proc.pid]:  # the workers first: each writes where it is stuck
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):  # whatever did not end on its own
                os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"{args[0]} hung for {HANG_S} s; its processes' stacks:\n{err[-12000:]}") from None
    assert proc.returncode == 0, err[-3000:]
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, deepest first (/proc's children lists)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in map(int, (task / "children").read_text().split()):
                found = [*descendants(child), child, *found]
    return found


def learned(summary):
    losses = summary["losses"]
    return losses[-1] < 0.6 * losses[0] and all(b <= a + 0.02 for a, b in zip(losses, losses[1:]))


def sparse_bytes_match(summary):
    """Top-k on 2 ranks: each step sends its entries once in one compact message and 2 int64s, its length and flag,
    per bucket (one bucket here): at most 4 bytes an entry with a 4-byte header and a count per block of 65,536
    elements (a step dense enough sends a bitmap instead, smaller), at least its fp16 values; the density the codec
    counted gives the entries."""
    n, density, sent = summary["parameters"], summary["counters"]["topk_density"], summary["bytes_per_step"]
    most = 4 * density * n + 4 + 4 * -(-n // BLOCK) + 2 + 16
    fp32_ring = 4 * n  # 4 bytes per element, 2·(2 − 1)/2 of them sent
    return 2 * density * n + 16 < sent <= 1.01 * most and sent < fp32_ring / 4


def test_torchrun_ddp_example_learns_with_fp8_bytes(tmp_path):
    summary = run(["torchrun_ddp.py", "--epochs", "6"], tmp_path)
    assert learned(summary), summary["losses"]
    n = summary["parameters"]
    ring = n * 2 * (summary["world"] - 1) / summary["world"]  # one byte per element around the ring
    assert ring <= summary["bytes_per_step"] <= ring + 64, (summary["bytes_per_step"], ring)  # + flag bytes


def test_accelerate_example_learns_with_top_k_bytes(tmp_path):
    summary = run(["accelerate.py", "--epochs", "4"], tmp_path)
    assert learned(summary), summary["losses"]
    assert 0.05 <= summary["counters"]["topk_density"] < 0.2  # reused thresholds let a little more through
    assert sparse_bytes_match(summary), summary


def test_lightning_example_learns_and_resumes_exactly(tmp_path):
    whole = run(["lightning.py", "--epochs", "2", "--params", "whole.pt"], tmp_path, launcher="python")
    run(["lightning.py", "--epochs", "2", "--stop-after", "1", "--checkpoint-dir", "ckpt"], tmp_path,
        launcher="python")
    resumed = run(["lightning.py", "--epochs", "2", "--resume", "ckpt/last.ckpt", "--params", "resumed.pt"], tmp_path,
                  launcher="python")
    assert learned(whole), whole["losses"]
    assert sparse_bytes_match(whole) and sparse_bytes_match(resumed)
    assert resumed["losses"] == whole["losses"][1:]
    a, b = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "resumed.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["scalesgd_hook"]
    assert len(saved) == 2 and any(not torch.equal(x["residual"], y["residual"])  # each rank's own residuals
                                   for x, y in zip(saved[0]["flat"]["params"].values(),
                                                   saved[1]["flat"]["params"].values()))


def test_transformer_example_trains_in_bf16_with_accumulation_and_sends_fp8_after_its_dense_start(tmp_path):
    summary = run(["transformer_ddp.py", "--codec", "fp8", "--dense-steps", "5"], tmp_path)
    losses, n = summary["losses"], summary["parameters"]
    assert sum(losses[-5:]) / 5 < 0.65 * losses[0] and summary["validation_loss"] < losses[0]
    dense, fp8 = 4 * n, n  # a ring on 2 ranks sends one gradient's worth: 4 bytes, then 1 byte per element
    expected = (5 * dense + 35 * fp8) / 40
    assert expected <= summary["bytes_per_step"] <= 1.01 * expected  # once per step, not per micro-batch


def test_the_transformer_trainer_with_diloco_learns_and_sends_a_pseudo_gradient_a_round(tmp_path):
    summary = run(["transformer_diloco.py", "--local-steps", "8", "--steps", "40"], tmp_path)
    losses, n = summary["losses"], summary["parameters"]
    assert sum(losses[-5:]) / 5 < 0.65 * losses[0] and summary["validation_loss"] < losses[0]
    assert summary["ranks_agree"] and summary["rounds"] == 40 // 8
    assert summary["bytes_sent"] == summary["rounds"] * 4 * n  # a ring on 2 ranks: one fp32 pseudo-gradient a round


def test_the_transformer_trainer_sharded_by_fsdp2_learns_holds_half_and_reduces_bf16_shards(tmp_path):
    summary = run(["transformer_fsdp.py", "--codec", "bf16", "--steps", "40"], tmp_path)
    losses, n = summary["losses"], summary["parameters"]
    assert sum(losses[-5:]) / 5 < 0.65 * losses[0] and summary["validation_loss"] < losses[0]
    assert sum(summary["held"]) == n and max(summary["held"]) < 0.55 * n  # each rank holds its half
    assert summary["bytes_per_step"] == 2 * n / 2  # a ring's reduce-scatter: half of the bf16 gradient, once a step
