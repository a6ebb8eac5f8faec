"""The training loop, the same on every rank: set-up, one epoch, evaluation, the end of an epoch, the end of a run."""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from scalesgd.comm.cost import planner
from scalesgd.comm.engine.exchange import ENGINES, GradientExchange
from scalesgd.comm.engine.policies import GradientNorms
from scalesgd.config import TrainConfig
from scalesgd.data import (
    DataBundle,
    FolderData,
    GlobalBatchSampler,
    LoaderSettings,
    default_loader_workers,
    open_pipeline,
)
from scalesgd.data.pipeline import FolderPipeline, MemoryPipeline
from scalesgd.models import MODELS
from scalesgd.recipe import build_scheduler, global_batch_loss
from scalesgd.recipe.adascale import AdaScaleFactor, gain
from scalesgd.recipe.noise_scale import NoiseScale
from scalesgd.runtime import process_group
from scalesgd.runtime.process_group import DistEnv
from scalesgd.trace import Tracer, write_chrome_trace
from scalesgd.train import auto, checkpoint, memory, metrics, report
from scalesgd.train.build import data_and_model
from scalesgd.train.checkpoint import Progress
from scalesgd.train.exchange import open_exchange
from scalesgd.train.evaluation import (
    Milestones,
    end_epoch,
    evaluate_at,
    skipped_files,
    skips_bad_files,
)
from scalesgd.train.objective import Objective, throughput_key
from scalesgd.train.progress import EpochProgress
from scalesgd.train.rundir import BUCKETS_NAME, METRICS_NAME, write_json
from scalesgd.train.timing import breakdown, iteration_timing
from scalesgd.train.window import WindowReads

PROBE_BATCHES = 4  # the first batches of the training set, in turn, for the planner's profile and auto's trials

EVAL_BATCH = 1000
SKIP_ITERS = 2  # first iterations of a run, left out of the timing breakdown (allocation, warm caches)
SKIPPED_LISTED = 1000  # bad files summary.json names (all are counted)


@dataclass
class Run:
    """What one rank trains with, built once by `setup`."""

    cfg: TrainConfig
    run_dir: Path
    env: DistEnv
    data: DataBundle | FolderData
    pipeline: MemoryPipeline | FolderPipeline  # each step's micro-batches, the test shards, the probes' batches
    model: nn.Module  # the bare model: evaluated and saved
    exchange: GradientExchange  # forward and backward through `exchange.model`, step `exchange.optimizer`
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: GlobalBatchSampler
    objective: Objective
    tracer: Tracer
    planned: dict  # the planner's predictions, if it chose the buckets
    auto: dict  # --exchange auto's decision and predictions, if it chose the exchange
    timings: list[dict] = field(default_factory=list)  # one per iteration
    noise: NoiseScale = field(default_factory=NoiseScale)  # --noise-scale's smoothed estimates
    milestones: Milestones = field(default_factory=Milestones)  # the training clock, --eval-every, --time-budget
    before_bytes: int = 0  # the process's resident set before data and model (Python, torch)
    startup_s: float = 0.0  # from the worker's start of training to its first step (data, model, codec kernels)


def train(cfg: TrainConfig, run_dir: Path, env: DistEnv | Future, resume: bool = False) -> dict:
    """Train `cfg` on this rank; rank 0 writes metrics, checkpoints and the report. Returns the summary.

    `env` may still be joining the process group (a Future): data and model are built meanwhile.
    """
    wall_start = time.perf_counter()
    run = setup(cfg, run_dir, env, resume)
    done = checkpoint.restore(run_dir, run.model, run.exchange, run.scheduler, run.env) if resume else Progress()
    run.startup_s = time.perf_counter() - wall_start
    run.noise = NoiseScale.from_state(done.noise)
    run.milestones = Milestones(cfg.output.eval_every, cfg.output.time_budget, done.clock_s, done.bytes_sent,
                                checkpoint_s=done.checkpoint_s, checkpoint_link_bytes=done.checkpoint_link_bytes)
    if run.env.is_main:  # a restart from the start, too, drops what the failed attempt logged
        metrics.truncate_after(run_dir / METRICS_NAME, done.iteration(len(run.sampler)))
        checkpoint.remove_temporaries(run_dir)
    log = metrics.MetricsLog(run_dir / METRICS_NAME) if run.env.is_main else None
    adascale, last_epoch = adascale_factor(run), cfg.recipe.epochs
    if adascale is not None:  # it trains until its schedule is done: epochs up to a bound
        last_epoch = adascale.epochs_at_most(len(run.sampler))
    shown = last_epoch if adascale is None else f"≤{last_epoch}"
    progress = EpochProgress(run.env.is_main and not cfg.output.quiet, shown)
    elapsed_before, images_per_s, record = done.elapsed_s, [], {}

    def save_mid_epoch(step: int, totals: torch.Tensor, epoch_s: float) -> None:
        """A checkpoint `step` steps into the epoch after `done`'s (collective)."""
        if log:
            log.flush()
        checkpoint.save(run_dir, cfg, run.model, run.exchange, run.scheduler,
                        replace(done, step=step, totals=tuple(totals.tolist()), epoch_s=epoch_s,
                                noise=run.noise.state(),
                                elapsed_s=elapsed_before + time.perf_counter() - wall_start,
                                **run.milestones.reading()), run.env)

    for epoch in range(done.epoch + 1, last_epoch + 1):
        if adascale is not None and adascale.done:
            break
        totals, seconds = train_epoch(run, epoch, log, progress, done if epoch == done.epoch + 1 else Progress(),
                                      save_mid_epoch)
        images_per_s.append(totals[2].item() / seconds)
        # the budget spent on the run's last step ended nothing early
        stopped = run.milestones.stopped = run.milestones.stopped and epoch < last_epoch
        if epoch < last_epoch and not stopped:
            run.pipeline.prepare(epoch + 1)  # the next epoch's batches decode while this one is evaluated
        else:  # what is still on its way lands: the last evaluation and checkpoint hold it all, its bytes counted
            run.exchange.settle()
            settled = run.exchange.stats()
            if settled is not None:
                run.milestones.count({"bytes_sent": settled.bytes_sent})
        with run.milestones.paused():
            record = end_epoch(run, epoch, totals, images_per_s[-1])
        record.update(noise_record(run))
        done = Progress(epoch, max(done.best_test_acc, record["test_acc"]),
                        elapsed_before + time.perf_counter() - wall_start, noise=run.noise.state(),
                        **run.milestones.reading())
        if log:
            log.write(record)
            log.flush()
        if stopped:  # the budget ended it mid-epoch: the last checkpoint stays the one to resume from
            break
        with run.milestones.checkpointing():
            checkpoint.save(run_dir, cfg, run.model, run.exchange, run.scheduler, done, run.env)
        progress.end_epoch(record)
    if log:
        log.close()
    done = replace(done, elapsed_s=elapsed_before + time.perf_counter() - wall_start)
    return finish(run, done, record, images_per_s, progress)


def setup(cfg: TrainConfig, run_dir: Path, env: DistEnv | Future, resume: bool) -> Run:
    """Data, model, optimizer, schedule and exchange, identical on every rank (`seed` fixes the weights)."""
    before = memory.resident_bytes()
    data, model = data_and_model(cfg)
    env = env.result() if isinstance(env, Future) else env
    model.to(env.device)
    sampler = GlobalBatchSampler(len(data.train), cfg.recipe.batch_size, env.world_size, env.rank, seed=cfg.recipe.seed)
    pipeline = open_pipeline(data, sampler, cfg.recipe.accumulate, loader_settings(cfg, env, data), env.rank,
                             env.world_size)
    if env.is_main:
        for path, what in getattr(data, "skipped", ()):
            print(f"scalesgd: skipped {path}: {what}", file=sys.stderr)
    objective = Objective(data.is_text, cfg.recipe.label_smoothing, data.sequence_length)
    plan, planned, chosen = None, {}, {}
    if cfg.exchange.auto:  # decided once, on the whole model before it is laid out: the codec decides how it is
        batches = pipeline.first_batches(cfg.micro_batch, PROBE_BATCHES)  # sharded (fixed batches: no RNG drawn)
        cfg, plan, chosen = auto.choose(cfg, model, batches, objective.loss, env, run_dir, resume, cfg.output.quiet)
    if cfg.exchange.sharded:  # the optimizer is built on the shards (within each node where hybrid)
        ENGINES[cfg.exchange.engine].shard(model, MODELS[cfg.model.name].shard_units(model), cfg.recipe.precision,
                                           cfg.exchange.codec, env.topology_groups if cfg.exchange.hybrid else None,
                                           env.device)
    optimizer = cfg.build_optimizer(model, len(sampler))
    scheduler = build_scheduler(optimizer, cfg.recipe.lr_schedule(len(sampler)).factor)
    tracer = Tracer(False)
    if cfg.exchange.planned:
        topk = cfg.exchange.codec_options["topk"]
        plan, planned = planner.plan_exchange(cfg.exchange.planner, topk.density, topk.reuse, model,
                                              pipeline.first_batches(cfg.micro_batch, PROBE_BATCHES)[0],
                                              objective.loss, env.exchange_group, run_dir, resume, wire=topk.wire)
    norms = GradientNorms() if cfg.measures_noise else None
    travel = cfg.exchange_setup(env.exchange_group, env.topology_groups, tracer, plan, len(sampler), norms)
    exchange = open_exchange(cfg, model, optimizer, travel)
    if env.is_main and exchange.plan is not None:
        write_json(run_dir / BUCKETS_NAME, exchange.plan.to_dict())
    return Run(cfg, run_dir, env, data, pipeline, model, exchange, scheduler, sampler, objective, tracer, planned,
               chosen, before_bytes=before)


def loader_settings(cfg: TrainConfig, env: DistEnv, data: DataBundle | FolderData) -> LoaderSettings:
    """How this rank's pipeline reads: loader processes, device, the crops' seed, evaluation batches of the training
    micro-batch's size for streamed images (EVAL_BATCH predictions for data held in memory)."""
    workers = cfg.data.loader_workers
    if workers is None:
        workers = default_loader_workers(process_group.local_world_size(cfg.runtime.workers))
    streamed = isinstance(data, FolderData)
    per_sample = data.sequence_length or 1
    return LoaderSettings(workers, env.device, cfg.recipe.seed, cfg.data.skip_bad_images,
                          cfg.micro_batch if streamed else max(1, EVAL_BATCH // per_sample))


def train_epoch(run: Run, epoch: int, log: metrics.MetricsLog | None, progress: EpochProgress,
                resumed: Progress, save_mid_epoch) -> tuple[torch.Tensor, float]:
    """One pass over the data (from `resumed.step` on, with its sums and seconds, where a mid-epoch checkpoint
    left it); (global loss sum, correct, samples) and the seconds it took.

    Each step's loss, correct count and size stay on the device; every `sync_every` steps (and at the
    epoch's end) one allreduce sums them across ranks and the host reads them (`WindowReads`: in a fixed group,
    a window later), so no step waits for the host (a non-finite loss stops the run at that read, naming its
    iteration). At those reads a mid-epoch checkpoint is taken when `checkpoint_every` says one is due (rank 0's
    clock, shared by the read).
    AdaScale's run ends within the epoch, at the step its schedule is done (every rank knows it from the same gains).
    """
    cfg, env, sampler, tracer = run.cfg, run.env, run.sampler, run.tracer
    net, opt = run.exchange.model, run.exchange.optimizer
    steps = len(sampler)
    every_steps, every_s = cfg.output.checkpoint_interval
    sampler.set_epoch(epoch)
    adascale = adascale_factor(run)
    tracer.enabled = bool(cfg.output.trace) and epoch == cfg.recipe.epochs  # the last epoch's timeline
    progress.start_epoch(epoch, steps - resumed.step)
    net.train()
    totals = torch.tensor(resumed.totals, dtype=torch.float64)
    # per step: loss, correct, samples, and the squared norms of the local and the exchanged gradient; + a "due" row
    window = torch.zeros(cfg.output.sync_every + 1, 5, dtype=torch.float64, device=env.device)
    pending: list[dict] = []  # the window's iterations, as the log will have them
    reads = WindowReads(env.members, log, progress, lagged=not env.members.may_abort and not cfg.measures_noise)
    start = last_saved = time.perf_counter() - resumed.epoch_s
    saved_at = resumed.step
    batches = run.pipeline.steps(resumed.step)  # from where the checkpoint this run resumed from left off
    streamed = isinstance(run.data, FolderData)
    for i in range(resumed.step, steps):
        waited = time.perf_counter()
        parts = next(batches)
        t0 = time.perf_counter()
        lr = opt.param_groups[0]["lr"]
        row = window[len(pending)]
        forward_backward(run, parts, sampler.global_counts(i), row)
        t1 = time.perf_counter()
        stepped = run.exchange.step()
        if cfg.measures_noise:
            row[3:] = run.exchange.pop_norms()
        if adascale is not None:
            adascale.advance()
        last = i == steps - 1 or (adascale is not None and adascale.done)
        run.scheduler.step()
        opt.zero_grad(set_to_none=True)
        counters = run.exchange.counters()
        run.timings.append({**iteration_timing(run.exchange.stats(), waited, t0, t1, time.perf_counter()),
                            **counters})
        run.milestones.count(run.timings[-1])
        iteration = (epoch - 1) * steps + i + 1
        if run.milestones.due(iteration):
            evaluated = evaluate_at(run, epoch, iteration)
            if log:
                log.write(evaluated)
        pending.append({"kind": "iter", "epoch": epoch, "iter": iteration, "lr": lr, **counters,
                        **({"data_wait_s": t0 - waited} if streamed else {}),
                        **({"skipped": not stepped, "loss_scale": run.exchange.scaler.get_scale()}
                           if run.exchange.scaler.is_enabled() else {}),
                        "notices": run.exchange.notices()})
        if len(pending) == cfg.output.sync_every or last:
            clock_due = env.is_main and every_s > 0 and time.perf_counter() - last_saved >= every_s
            read = reads.send(window, len(pending), (clock_due, env.is_main and run.milestones.spent()), pending)
            pending = []
            if last or read.spent or read.due or every_steps and i + 1 - saved_at >= every_steps:
                read = read.then(reads.drain())  # every window in before the epoch ends, the run stops or saves
            totals += read.rows[:, :3].sum(0)
            if cfg.measures_noise:
                for _, _, samples, local_sq, mean_sq in read.rows.tolist():  # summed over ranks: ÷ W for the means
                    run.noise.update(local_sq / env.world_size, mean_sq / env.world_size,
                                     samples / env.world_size, samples)
            if adascale is not None:  # the gain for the next window's steps
                adascale.gain = gain(run.noise.trace, run.noise.gradient_sq, cfg.recipe.base_batch,
                                     cfg.recipe.batch_size)
            run.milestones.stopped = read.spent and not (adascale is not None and adascale.done)  # an epoch's end too
            if not last and not read.spent and (read.due or every_steps and i + 1 - saved_at >= every_steps):
                with run.milestones.checkpointing():
                    save_mid_epoch(i + 1, totals, time.perf_counter() - start)
                last_saved, saved_at = time.perf_counter(), i + 1
        if last or run.milestones.stopped:
            break
    return totals, time.perf_counter() - start


def forward_backward(run: Run, parts: list[tuple[torch.Tensor, torch.Tensor]], global_count: int,
                     row: torch.Tensor) -> None:
    """This rank's share of one step, in its micro-batches whose gradients sum (only the last one's backward
    exchanges): the loss is the global batch's mean over every prediction. Its loss sum, correct predictions and
    predictions go into `row`."""
    exchange, tracer = run.exchange, run.tracer
    scale = global_count * run.objective.predictions_per_sample
    sums = torch.zeros(3, dtype=torch.float64, device=run.env.device)
    for j, (x, y) in enumerate(parts):
        with exchange.no_sync() if j < len(parts) - 1 else nullcontext():
            with tracer.span("forward"), exchange.autocast():
                loss_sum, correct = run.objective(exchange.model(x), y)
            with tracer.span("backward"):
                exchange.backward(global_batch_loss(loss_sum, run.env.world_size, scale))
        sums[0] += loss_sum.detach()
        sums[1] += correct
        sums[2] += y.numel()
    row[:3] = sums


def adascale_factor(run: Run) -> AdaScaleFactor | None:
    """The schedule's AdaScale factor (one, shared by every param group), or None for the other rules."""
    factor = run.scheduler.lr_lambdas[0]
    return factor if isinstance(factor, AdaScaleFactor) else None


def noise_record(run: Run) -> dict:
    """What an epoch line says of the noise: B_simple now and averaged over the run so far (--noise-scale),
    AdaScale's gain and scale-invariant epochs."""
    record = ({"noise_scale": run.noise.value, "noise_scale_average": run.noise.average}
              if run.cfg.output.noise_scale else {})
    factor = adascale_factor(run)
    if factor is not None:
        record.update(adascale_gain=factor.gain, scale_invariant_epochs=factor.progress / factor.base.steps_per_epoch)
    return record


def finish(run: Run, done: Progress, record: dict, images_per_s: list[float], progress: EpochProgress) -> dict:
    """Write the trace, stop the exchange, and (rank 0) write summary.json and report.png; the summary."""
    if run.cfg.output.trace:
        save_trace(run.cfg.output.trace, run.tracer, run.env)
    held = memory.per_rank(run.exchange.optimizer, run.env.device, run.env.members, run.before_bytes)
    run.exchange.close()
    run.pipeline.close()
    timed = run.timings[SKIP_ITERS:] or run.timings
    summary = {
        "final_test_acc": record.get("test_acc", done.best_test_acc), "best_test_acc": done.best_test_acc,
        **{f"final_{key}": record[key] for key in ("test_loss", "test_perplexity") if key in record},
        "wall_time_s": done.elapsed_s, "startup_s": run.startup_s, "train_s": run.milestones.train_s(),
        "bytes_sent": run.milestones.bytes_sent, "checkpoint_s": run.milestones.checkpoint_s,
        "checkpoint_link_bytes": run.milestones.checkpoint_link_bytes,
        **({"stopped_by_time_budget": True} if run.milestones.stopped else {}),
        throughput_key(run.data.is_text): statistics.fmean(images_per_s) if images_per_s else 0.0,
        "epochs": run.cfg.recipe.epochs, "epochs_trained": done.epoch, "steps_per_epoch": len(run.sampler),
        "peak_lr": run.cfg.recipe.peak_lr, "world_size": run.env.world_size, "run_dir": str(run.run_dir),
        "iteration": {**breakdown(timed), "first_iteration_s": run.timings[0]["iteration_s"] if run.timings else 0.0},
        "memory": held,
        "config": run.cfg.to_dict(),
    }
    if run.planned:
        measured = [t["compute_s"] + t["exposed_comm_s"] for t in timed]
        summary["planner"] = {**run.planned, "measured_iteration_s": statistics.median(measured)}
    if run.cfg.output.noise_scale:  # B_simple in samples at the end and over the run, beside the batch trained with
        summary.update(noise_scale=run.noise.value, noise_scale_average=run.noise.average)
    if skips_bad_files(run):  # every rank's, once each
        skipped = skipped_files(run)
        summary.update(skipped_images=len(skipped), skipped_files=dict(sorted(skipped.items())[:SKIPPED_LISTED]))
    if run.auto:  # predicted against measured: the step is in both
        summary["auto"] = {**run.auto, "measured_iteration_s": summary["iteration"].get("median_iteration_s")}
    if run.env.is_main:
        report.write_summary(run.run_dir, summary)
        report.plot_report(run.run_dir)
        progress.table(report.summary_table(summary))
    return summary


def save_trace(path: str, tracer: Tracer, env: DistEnv) -> None:
    """Gather every rank's spans on rank 0 and write one Chrome trace."""
    everyone = env.members.all_gather_object(tracer.events)
    if env.is_main:
        write_chrome_trace(Path(path), everyone)
