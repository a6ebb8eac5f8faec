"""`--exchange auto` in a training run: decide once at start-up (kept on resume), show the table, use the choice."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

from scalesgd.comm.buckets import BucketPlan, model_tensors, plan_from_groups
from scalesgd.config import TrainConfig
from scalesgd.output import rich_table
from scalesgd.runtime.process_group import DistEnv
from scalesgd.sim.auto import Decision, decide
from scalesgd.train.rundir import AUTO_NAME, write_json


def choose(cfg: TrainConfig, model: torch.nn.Module, batch, loss_fn, env: DistEnv, run_dir: Path | None,
           resume: bool, quiet: bool = False) -> tuple[TrainConfig, BucketPlan, dict]:
    """The config with auto's codec, its bucket plan, and the decision's record (collective).

    A resumed run keeps the decision it started with: its codec state belongs to that exchange.
    """
    saved = run_dir / AUTO_NAME if run_dir is not None else None
    if resume and saved is not None and saved.exists():
        decision = Decision.from_dict(json.loads(saved.read_text()))
    else:
        decision = decide(model, batch, loss_fn, cfg.auto_codecs, cfg.codec_settings(), cfg.algorithm,
                          env.exchange_group, env.topology_groups, env.local_world_size
                          if not cfg.procs_per_node else cfg.procs_per_node, cfg.per_worker_batch)
        if env.is_main and saved is not None:
            write_json(saved, decision.to_dict())
    if env.is_main and not quiet:
        show(decision)
    chosen = replace(cfg, codec=decision.codec, buckets="size:1")
    plan = plan_from_groups(decision.groups, model_tensors(model), f"auto:{decision.buckets}")
    return chosen, plan, decision.to_dict()


def show(decision: Decision) -> None:
    """The predicted iteration of every candidate, the chosen one first."""
    rows = sorted(decision.table, key=lambda r: r["iteration_s"])
    Console().print(rich_table(f"--exchange auto chose {decision.codec} with buckets {decision.buckets}",
                               ["codec", "buckets", "predicted ms", "exposed ms"],
                               [[r["codec"], r["buckets"], f"{1e3 * r['iteration_s']:.1f}",
                                 f"{1e3 * r['exposed_comm_s']:.1f}"] for r in rows]))
