"""The training loop through `scalesgd train`: its artefacts, the engines agreeing, a trace, a non-finite loss,
accumulated micro-batches, a language model in fp16."""

import json
import math
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch

from scalesgd.config import TrainConfig
from scalesgd.errors import NonFiniteLoss
from scalesgd.models import build_model
from scalesgd.runtime.process_group import DistEnv
from scalesgd.train import loop
from tests.spawn_util import run_workers
from tests.train.cli import FAST, load_ckpt, scalesgd


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
    # start-up (data, model, a codec's kernels) is off the training clock, and said
    assert 0 < summary["startup_s"] <= summary["wall_time_s"] - summary["train_s"]
    assert (run / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = load_ckpt(run)
    assert {"model", "optimizer", "scheduler", "epoch", "rng", "config"} <= set(state)
    assert state["epoch"] == 2 and len(state["rng"]["torch"]) == 2


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
        for name in ("forward", "backward", "encode", "wire", "reduce", "decode", "optimizer step"):
            assert (rank, name) in spans


def test_a_lossy_codec_logs_its_counters_per_step_and_in_the_summary(tmp_path):
    run = tmp_path / "fp8"
    proc = scalesgd("train", "--codec", "fp8", "--compress-after", "5", "--run-dir", str(run), *ENGINE_RUN)
    assert proc.returncode == 0, proc.stderr
    iters = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "iter"]
    assert [("fp8_saturated" in r) for r in iters[:7]] == [False] * 5 + [True] * 2  # dense for 5 steps
    assert all(0 <= r["fp8_saturated"] < 0.05 and 0 <= r["fp8_flushed"] < 0.05 for r in iters[5:])
    summary = json.loads((run / "summary.json").read_text())
    assert 0 <= summary["iteration"]["mean_fp8_saturated"] < 0.05
    assert (run / "report.png").read_bytes()[:4] == b"\x89PNG"


def train_until_nan(rank, world, run_dir):
    """Train with a gradient that turns to NaN from the second epoch on."""
    cfg = TrainConfig.of(workers=world, epochs=3, warmup_epochs=0, batch_size=256, quiet=True, run_dir=run_dir)
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



TEXT_RUN = ["--quiet", "--dataset", "text", "--model", "gpt", "--samples", "96", "--gpt-layers", "1", "--gpt-width",
            "32", "--gpt-heads", "2", "--gpt-block", "16", "--batch-size", "16", "--base-batch", "16", "--epochs", "1",
            "--warmup", "none", "--seed", "1"]


@pytest.mark.parametrize("engine", ["ddp", "scalesgd"])
def test_accumulated_micro_batches_make_one_large_batchs_update_and_exchange_once(tmp_path, engine):
    """4 micro-batches of 2 per worker step as one batch of 8 does (a model without batch statistics), and each step
    sends the gradient once."""
    models, summaries = [], []
    for parts in (1, 4):
        run = tmp_path / f"accumulate-{parts}"
        proc = scalesgd("train", *TEXT_RUN, "--engine", engine, "--accumulate", str(parts), "--run-dir", str(run))
        assert proc.returncode == 0, proc.stderr
        models.append(load_ckpt(run)["model"])
        summaries.append(json.loads((run / "summary.json").read_text()))
    a, b = models
    diff = torch.cat([(a[k] - b[k]).flatten().double() for k in a]).norm()
    assert (diff / torch.cat([a[k].flatten().double() for k in a]).norm()).item() < 1e-5
    if engine == "scalesgd":  # bytes per step: one exchange of the gradient, whatever the micro-batches
        assert summaries[0]["iteration"]["mean_bytes_sent"] == summaries[1]["iteration"]["mean_bytes_sent"] > 0


def test_a_language_model_in_fp16_with_a_sparse_codec_under_adamw_learns_warns_once_and_reports_perplexity(tmp_path):
    run = tmp_path / "gpt"
    proc = scalesgd("train", *TEXT_RUN, "--epochs", "2", "--engine", "scalesgd", "--codec", "topk", "--density", "0.1",
                    "--compress-after", "0", "--optimizer", "adamw", "--base-lr", "0.003", "--precision", "fp16",
                    "--accumulate", "2", "--run-dir", str(run))
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("scalesgd: warning:")]
    assert len(warnings) == 1 and "--momentum-correction carries Adam's momentum" in warnings[0], proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_test_loss"] < math.log(256) - 0.5  # below a uniform guess over the bytes: it learns
    assert summary["final_test_perplexity"] == pytest.approx(math.exp(summary["final_test_loss"]))
    assert summary["tokens_per_s"] > 0 and "images_per_s" not in summary
    iters = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "iter"]
    assert all(r["loss_scale"] > 0 and "skipped" in r for r in iters) and "topk_density" in iters[-1]
    # report.png: 4 panels of 8 × 3 inches at 110 dpi (loss, perplexity, learning rate, the codec's counters), each
    # with its first curve in matplotlib's first colour (C0, blue) across the iterations, not only a legend's sample
    image = matplotlib.image.imread(run / "report.png")
    assert image.shape[:2] == (4 * 3 * 110, 8 * 110)
    blue = image[..., 2] - image[..., 0] > 0.3
    columns = [panel.any(0).sum() for panel in np.array_split(blue, 4)]
    assert all(c > image.shape[1] / 4 for c in columns), columns


def test_the_exchange_the_end_of_a_run_lands_is_counted_in_its_bytes(tmp_path):
    """A periodic run whose only round is cut short by its end averages the workers there: that exchange, the whole
    model once in fp32 (2 ranks' ring: each sends the model's bytes), is the run's as much as one inside the loop."""
    run = tmp_path / "run"
    proc = scalesgd("train", "--workers", "2", "--epochs", "1", "--local-steps", "1000", "--run-dir", str(run), *FAST)
    assert proc.returncode == 0, proc.stderr
    model = build_model("resnet8", 10, 1)  # the digits' model
    assert json.loads((run / "summary.json").read_text())["bytes_sent"] == 4 * sum(p.numel() for p in
                                                                                   model.parameters())


def test_a_resumed_run_continues_the_training_clock_and_the_bytes_sent(tmp_path):
    """Evaluations after a resume read the training clock and the bytes where the checkpoint left them, not the wall
    clock (which counts start-up and evaluations); the checkpoints' seconds go on from where it left them too."""
    run = tmp_path / "resumed"
    proc = scalesgd("train", "--workers", "2", "--epochs", "1", "--engine", "scalesgd", "--run-dir", str(run), *FAST)
    assert proc.returncode == 0, proc.stderr
    saved = load_ckpt(run)
    assert 0 < saved["train_s"] < saved["elapsed_s"] and saved["bytes_sent"] > 0
    earlier_checkpoints_s = 1000.0  # as if the run had checkpointed for that long before
    torch.save({**saved, "checkpoint_s": earlier_checkpoints_s}, run / "checkpoint.pt")
    proc = scalesgd("train", "--resume", str(run), "--epochs", "2", "--eval-every", "1")
    assert proc.returncode == 0, proc.stderr
    evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    first = evals[0]  # one step after the resume
    step_s = json.loads((run / "summary.json").read_text())["iteration"]["first_iteration_s"]
    left_out_s = saved["elapsed_s"] - saved["train_s"]  # start-up, evaluation and checkpoint before the resume
    # the clock gained the step since the resume, not the wall clock's start-up and evaluations
    assert saved["train_s"] + step_s <= first["train_s"] < saved["train_s"] + step_s + left_out_s
    per_step = saved["bytes_sent"] / 12
    assert first["bytes_sent"] == pytest.approx(saved["bytes_sent"] + per_step, rel=0.05)
    summary = json.loads((run / "summary.json").read_text())
    assert earlier_checkpoints_s < summary["checkpoint_s"] < earlier_checkpoints_s + summary["wall_time_s"]
