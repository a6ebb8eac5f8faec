"""The training loop: one readable path from data to checkpoint, the same on every rank."""

from __future__ import annotations

import json
import math
import statistics
import time
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scalesgd.config import TrainConfig
from scalesgd.data import GlobalBatchSampler, load_bundle, random_crop_flip
from scalesgd.errors import NonFiniteLoss
from scalesgd.models import build_model
from scalesgd.recipe import (LrFactor, build_optimizer, build_scheduler, global_batch_loss, initialize,
                             use_ghost_batch)
from scalesgd.trace import Tracer, write_chrome_trace
from scalesgd.train import checkpoint, engines, metrics, planning, report
from scalesgd.train.distributed import DistEnv, sync_buffers
from scalesgd.train.progress import EpochProgress

EVAL_BATCH = 1000
SKIP_ITERS = 2  # first iterations of a run, left out of the timing breakdown (allocation, warm caches)


def train(cfg: TrainConfig, run_dir: Path, env: DistEnv | Future, resume: bool = False) -> dict:
    """Train `cfg` on this rank; rank 0 writes metrics, checkpoints and the report. Returns the summary.

    `env` may still be joining the process group (a Future): data and model are built meanwhile.
    """
    wall_start = time.perf_counter()
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    data = load_bundle(cfg.dataset, data_dir=cfg.data_dir, samples=cfg.samples,
                       image_size=cfg.image_size, num_classes=cfg.classes)
    model = initialize(build_model(cfg.model, data.num_classes, data.in_channels), cfg.zero_gamma, cfg.bn_momentum)
    use_ghost_batch(model, cfg.bn_batch)
    optimizer = build_optimizer(model, cfg.optimizer, cfg.peak_lr, cfg.momentum, cfg.nesterov, cfg.weight_decay,
                                cfg.bias_decay, cfg.trust_coefficient)
    env = env.result() if isinstance(env, Future) else env
    model.to(env.device)
    sampler = GlobalBatchSampler(len(data.train), cfg.batch_size, env.world_size, env.rank, seed=cfg.seed)
    steps_per_epoch = len(sampler)
    scheduler = build_scheduler(optimizer, lr_factor(cfg, steps_per_epoch))
    criterion = nn.CrossEntropyLoss(reduction="sum", label_smoothing=cfg.label_smoothing)

    tracer = Tracer(False)
    plan, planned = None, {}
    if cfg.planner != "none":
        first = torch.arange(min(cfg.per_worker_batch, len(data.train.y)))  # a fixed batch: no RNG drawn
        batch = (data.train.x[first].to(env.device), data.train.y[first].to(env.device))
        plan, planned = planning.plan_exchange(cfg, model, batch, criterion, env, run_dir, resume)
    net, opt = engines.wrap(cfg, model, optimizer, env, tracer, plan)
    codec = engines.codec_of(net, opt)
    if env.is_main and hasattr(opt, "plan"):
        (run_dir / "buckets.json").write_text(json.dumps(opt.plan.to_dict(), indent=2) + "\n", encoding="utf-8")

    start_epoch, best_acc, elapsed_before = 0, 0.0, 0.0
    if resume:  # after wrapping: `opt` is what was saved (with the engine's state for scalesgd)
        state = checkpoint.load(run_dir / checkpoint.CHECKPOINT_NAME)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if codec is not None and state.get("codec_states"):
            codec.load_state_dict(state["codec_states"][env.rank])  # this rank's own
        torch.set_rng_state(state["rng"]["torch"][env.rank])
        start_epoch, best_acc = state["epoch"], state["best_test_acc"]
        elapsed_before = state["elapsed_s"]
        if env.is_main:
            metrics.truncate_after_epoch(run_dir / metrics.METRICS_NAME, start_epoch)

    log = metrics.MetricsLog(run_dir / metrics.METRICS_NAME) if env.is_main else None
    progress = EpochProgress(env.is_main and not cfg.quiet, cfg.epochs)
    images_per_s: list[float] = []
    timings: list[dict] = []
    record: dict = {}
    for epoch in range(start_epoch + 1, cfg.epochs + 1):
        sampler.set_epoch(epoch)
        tracer.enabled = bool(cfg.trace) and epoch == cfg.epochs  # the last epoch's timeline
        progress.start_epoch(epoch, steps_per_epoch)
        net.train()
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, samples (global)
        epoch_start = time.perf_counter()
        for i, indices in enumerate(sampler):
            t0 = time.perf_counter()
            x, y = data.train.x[indices], data.train.y[indices]
            if data.augment:
                x = random_crop_flip(x)
            x, y = x.to(env.device, non_blocking=True), y.to(env.device, non_blocking=True)
            lr = optimizer.param_groups[0]["lr"]
            with tracer.span("forward"):
                logits = net(x)
                loss_sum = criterion(logits, y)
            with tracer.span("backward"):
                global_batch_loss(loss_sum, env.world_size, sampler.global_counts(i)).backward()
            t1 = time.perf_counter()
            step_stats = torch.stack([loss_sum.detach().double().cpu(),
                                      (logits.argmax(1) == y).sum().double().cpu(),
                                      torch.tensor(float(len(y)), dtype=torch.float64)])
            dist.all_reduce(step_stats)
            step_loss = (step_stats[0] / step_stats[2]).item()
            global_iter = (epoch - 1) * steps_per_epoch + i + 1
            if not math.isfinite(step_loss):
                raise NonFiniteLoss(f"loss became {step_loss} at epoch {epoch}, iteration {global_iter}")
            opt.step()
            scheduler.step()
            opt.zero_grad(set_to_none=True)
            timings.append(iteration_timing(opt, t0, t1, time.perf_counter()))
            totals += step_stats
            if log:
                log.write({"kind": "iter", "epoch": epoch, "iter": global_iter, "lr": lr, "loss": step_loss})
            progress.advance(step_loss, lr)
        train_time = time.perf_counter() - epoch_start
        images_per_s.append(totals[2].item() / train_time)

        sync_buffers(model)  # evaluate and save rank 0's BN statistics, as DDP's forward does
        test_loss, test_acc = evaluate(model, data.test, env)
        best_acc = max(best_acc, test_acc)
        record = {"kind": "epoch", "epoch": epoch, "iter": epoch * steps_per_epoch,
                  "train_loss": totals[0].item() / totals[2].item(),
                  "train_acc": totals[1].item() / totals[2].item(),
                  "test_loss": test_loss, "test_acc": test_acc,
                  "images_per_s": images_per_s[-1], "lr": optimizer.param_groups[0]["lr"]}
        rng_states = gather_rng_states(env)
        codec_states = gather_codec_states(codec, env)
        if env.is_main:
            log.write(record)
            log.flush()
            checkpoint.save_atomic({
                "model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "rng": {"torch": rng_states},
                "config": cfg.to_dict(), "best_test_acc": best_acc,
                "elapsed_s": elapsed_before + time.perf_counter() - wall_start,
                "codec_states": codec_states,
            }, run_dir / checkpoint.CHECKPOINT_NAME)
        progress.end_epoch(record)

    if cfg.trace:
        save_trace(cfg.trace, tracer, env)
    if hasattr(opt, "close"):
        opt.close()
    summary = {
        "final_test_acc": record.get("test_acc", best_acc), "best_test_acc": best_acc,
        "wall_time_s": elapsed_before + time.perf_counter() - wall_start,
        "images_per_s": sum(images_per_s) / len(images_per_s) if images_per_s else 0.0,
        "epochs": cfg.epochs, "steps_per_epoch": steps_per_epoch, "peak_lr": cfg.peak_lr,
        "world_size": env.world_size, "run_dir": str(run_dir),
        "iteration": {**breakdown(timings[SKIP_ITERS:] or timings),
                      "first_iteration_s": timings[0]["iteration_s"] if timings else 0.0},
        "config": cfg.to_dict(),
    }
    if planned:
        measured = [t["compute_s"] + t["exposed_comm_s"] for t in timings[SKIP_ITERS:] or timings]
        summary["planner"] = {**planned, "measured_iteration_s": statistics.median(measured)}
    if env.is_main:
        log.close()
        report.write_summary(run_dir, summary)
        report.plot_report(run_dir)
        progress.table(report.summary_table(summary))
    return summary


def lr_factor(cfg: TrainConfig, steps_per_epoch: int) -> LrFactor:
    """The run's schedule as a pure function of the global step."""
    return LrFactor(
        total_steps=cfg.epochs * steps_per_epoch, steps_per_epoch=steps_per_epoch,
        warmup=cfg.warmup, warmup_steps=round(cfg.warmup_epochs * steps_per_epoch),
        start=min(cfg.base_lr / cfg.peak_lr, 1.0), schedule=cfg.schedule,
        milestones=cfg.resolved_milestones, gamma=cfg.gamma, power=cfg.power, end=cfg.end_lr / cfg.peak_lr,
        arccot_epoch=cfg.resolved_arccot_epoch, arccot_slope=cfg.arccot_slope,
    )


def iteration_timing(opt, start: float, backward_end: float, end: float) -> dict:
    """One iteration's times; the scalesgd engine also says how much of its exchange was hidden."""
    timing = {"iteration_s": end - start, "compute_s": backward_end - start}
    if hasattr(opt, "pop_stats"):
        stats = opt.pop_stats()
        timing.update(codec_s=stats.codec_s, comm_s=stats.comm_s, exposed_comm_s=stats.exposed_s,
                      overlapped_comm_s=stats.overlapped_s, bytes_sent=stats.bytes_sent)
    return timing


def breakdown(timings: list[dict]) -> dict:
    """Median iteration time and the mean of each part, for summary.json."""
    if not timings:
        return {}
    out = {"iterations": len(timings), "median_iteration_s": statistics.median(t["iteration_s"] for t in timings)}
    for key in timings[0]:
        out[f"mean_{key}"] = statistics.fmean(t[key] for t in timings)
    return out


@torch.no_grad()
def evaluate(model: nn.Module, split, env: DistEnv) -> tuple[float, float]:
    """Test loss and accuracy, each rank taking a strided shard, summed across ranks."""
    model.eval()
    shard = torch.arange(env.rank, len(split), env.world_size)
    sums = torch.zeros(3, dtype=torch.float64)
    for chunk in shard.split(EVAL_BATCH):
        x, y = split.x[chunk].to(env.device), split.y[chunk].to(env.device)
        logits = model(x)
        sums[0] += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        sums[1] += (logits.argmax(1) == y).sum().item()
        sums[2] += len(chunk)
    dist.all_reduce(sums)
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def gather_rng_states(env: DistEnv) -> list[torch.Tensor]:
    """Every rank's CPU RNG state (data augmentation draws from it), for an exact resume."""
    state = torch.get_rng_state()
    states = [torch.empty_like(state) for _ in range(env.world_size)]
    dist.all_gather(states, state)
    return states


def gather_codec_states(codec, env: DistEnv) -> list[dict]:
    """Every rank's codec state (residuals differ per rank), for an exact resume; [] without a codec."""
    if codec is None:
        return []
    states: list = [None] * env.world_size
    dist.all_gather_object(states, codec.state_dict())
    return states


def save_trace(path: str, tracer: Tracer, env: DistEnv) -> None:
    """Gather every rank's spans on rank 0 and write one Chrome trace."""
    everyone: list = [None] * env.world_size
    dist.all_gather_object(everyone, tracer.events)
    if env.is_main:
        write_chrome_trace(Path(path), everyone)
