"""`--exchange auto` in a training run: decide once at start-up (kept on resume), show the table, use the choice."""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from scalesgd.comm.buckets import BucketPlan, model_tensors, plan_from_groups
from scalesgd.comm.exchange import build_exchange
from scalesgd.config import TrainConfig
from scalesgd.output import console as make_console, rich_table
from scalesgd.runtime.process_group import DistEnv
from scalesgd.sim.auto import Decision, decide
from scalesgd.train.rundir import AUTO_NAME, write_json

TRIAL_WARMUP = 2  # untimed iterations per finalist (kernels, a sparse codec's first threshold)
TRIAL_ROUNDS, TRIAL_PER_ROUND = 3, 2  # finalists take turns, so a slow spell of the machine hits them all


def choose(cfg: TrainConfig, model: torch.nn.Module, batches: list, loss_fn, env: DistEnv, run_dir: Path | None,
           resume: bool, quiet: bool = False) -> tuple[TrainConfig, BucketPlan, dict]:
    """The config with auto's codec, its bucket plan, and the decision's record (collective).

    The model ranks every candidate; the finalists it cannot tell apart are then run for real on copies of
    the model over `batches`, and the one measured fastest is used. A resumed run keeps the decision it
    started with: its codec state belongs to that exchange.
    """
    saved = run_dir / AUTO_NAME if run_dir is not None else None
    if resume and saved is not None and saved.exists():
        decision = Decision.from_dict(json.loads(saved.read_text()))
    else:
        decision = decide(model, batches[0], loss_fn, cfg.auto_codecs, cfg.codec_settings(), cfg.algorithm,
                          env.exchange_group, env.topology_groups, env.local_world_size
                          if not cfg.procs_per_node else cfg.procs_per_node, cfg.per_worker_batch)
        if len(decision.finalists) > 1:
            decision = decision.tried(trial(cfg, model, batches, loss_fn, env, decision.finalists))
        if env.is_main and saved is not None:
            write_json(saved, decision.to_dict())
    if env.is_main and not quiet:
        show(decision)
    chosen = replace(cfg, codec=decision.codec, buckets="size:1")
    plan = plan_from_groups(decision.groups, model_tensors(model), f"auto:{decision.buckets}")
    return chosen, plan, decision.to_dict()


def trial(cfg: TrainConfig, model: torch.nn.Module, batches: list, loss_fn, env: DistEnv,
          finalists: list[dict]) -> list[float]:
    """Each finalist's median iteration (slowest rank's), run in turns on its own copy of the model (collective).

    Each runs compressed from its first step, in a process group of its own, with this run's optimizer; the
    copies and their exchanges are dropped after, so the run starts from the weights it had.
    """
    runs = []
    for finalist in finalists:
        net = copy.deepcopy(model)
        setup = replace(cfg, codec=finalist["codec"], compress_after="0", density_warmup=0).exchange_setup(
            dist.new_group(), env.topology_groups,
            plan=plan_from_groups(finalist["groups"], model_tensors(net), f"auto:{finalist['buckets']}"))
        runs.append(build_exchange(cfg.engine, net, cfg.build_optimizer(net), setup))
    times: list[list[float]] = [[] for _ in runs]
    for i in range(TRIAL_WARMUP):
        for exchange in runs:
            _step(exchange, batches[i % len(batches)], loss_fn)
    for _ in range(TRIAL_ROUNDS):
        for exchange, took in zip(runs, times):
            dist.barrier()
            took += [_step(exchange, batches[i % len(batches)], loss_fn) for i in range(TRIAL_PER_ROUND)]
    for exchange in runs:
        exchange.close()
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return [statistics.median(row) for row in slowest.tolist()]


def _step(exchange, batch, loss_fn) -> float:
    """One training iteration through `exchange`: forward, backward, exchange, step; its seconds on this rank."""
    x, y = batch
    start = time.perf_counter()
    loss_fn(exchange.model(x), y).backward()
    exchange.optimizer.step()
    exchange.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def show(decision: Decision) -> None:
    """The predicted iteration of every candidate, the chosen one first; then the finalists' trials."""
    rows = sorted(decision.table, key=lambda r: r["iteration_s"])
    console = make_console()
    console.print(rich_table(f"--exchange auto chose {decision.codec} with buckets {decision.buckets}",
                             ["codec", "buckets", "predicted ms", "exposed ms"],
                             [[r["codec"], r["buckets"], f"{1e3 * r['iteration_s']:.1f}",
                               f"{1e3 * r['exposed_comm_s']:.1f}"] for r in rows]))
    tried = [f for f in decision.finalists if "measured_s" in f]
    if tried:
        console.print(rich_table("finalists run for real", ["codec", "buckets", "predicted ms", "measured ms"],
                                 [[f["codec"], f["buckets"], f"{1e3 * f['predicted_s']:.1f}",
                                   f"{1e3 * f['measured_s']:.1f}"] for f in tried]))
