"""`python -m scalesgd.bench.elastic.torchft_replica`: one replica group of torchft's DiLoCo with its fault tolerance on, as
torchft's `train_diloco.py` runs one — a process per group under its own `torchrun --max-restarts`, the lighthouse
apart (`torchft_lighthouse`), `min_replica_size` below the number of groups, the data sharded by replica group
(torchft's `DistributedSampler`) — training our model on our data with our recipe, so that it sits beside our elastic
rounds under one failure schedule. A quorum takes whoever is alive; a round a replica fails in is discarded by every
replica of it; a replica behind heals from a peer. Each replica logs its rounds (committed or discarded, with the
quorum's size); replica 0 also evaluates the global model and writes the run's records and summary."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

from scalesgd.config import TrainConfig
from scalesgd.data import GlobalBatchSampler
from scalesgd.data.pipeline import MemoryPipeline
from scalesgd.errors import UsageError
from scalesgd.peers.torchft_diloco import ReplicaGroup, TorchftExchange
from scalesgd.recipe import build_scheduler, global_batch_loss
from scalesgd.runtime.forked import name_process
from scalesgd.runtime.process_group import set_threads
from scalesgd.trace import Tracer
from scalesgd.train import metrics, report
from scalesgd.train.build import data_and_model
from scalesgd.train.elastic import at_step, evaluated
from scalesgd.train.evaluation import Milestones
from scalesgd.train.loop import EVAL_BATCH
from scalesgd.train.objective import Objective
from scalesgd.train.rundir import METRICS_NAME

# torchft's example: a collective may take 10 s (at 10 Mbit/s the default GPT's fp32 allreduce takes ~4 s: kept), a
# heal 10 s (the parameters and both optimizers' states, ~15 MB, take ~12 s there: 60 s); a quorum waits for the
# lighthouse's join window (60 s)
COLLECTIVE_S, HEAL_S, QUORUM_S = 10.0, 60.0, 120.0


def train_replica(cfg: TrainConfig, replica: int, replicas: int, group: ReplicaGroup, run_dir: Path) -> int:
    """Train replica group `replica` of `replicas` until the global model has taken every step of the run."""
    began = time.time()
    set_threads(cfg.runtime.threads)
    data, model = data_and_model(cfg)
    sampler = GlobalBatchSampler(len(data.train), cfg.recipe.batch_size, replicas, replica, seed=cfg.recipe.seed)
    per_epoch, local_steps = len(sampler), cfg.periodic.local_steps
    total = per_epoch * cfg.recipe.epochs
    per_sample = data.sequence_length or 1
    pipeline = MemoryPipeline(data, sampler, cfg.recipe.accumulate, torch.device("cpu"),
                              max(1, EVAL_BATCH // per_sample))
    objective = Objective(data.is_text, cfg.recipe.label_smoothing, data.sequence_length)
    optimizer = cfg.build_optimizer(model, per_epoch)
    scheduler = build_scheduler(optimizer, cfg.recipe.lr_schedule(per_epoch).factor)
    setup = cfg.exchange_setup(None, None, Tracer(False), None, per_epoch)
    exchange = TorchftExchange(model, optimizer, setup, cfg.periodic, group)
    manager, writes = exchange.manager, replica == 0
    run_dir.mkdir(parents=True, exist_ok=True)
    log = metrics.MetricsLog(run_dir / METRICS_NAME)
    log.write({"kind": "start", "at": began, "replica": replica})
    log.flush()  # a launch killed before its first round still counts as one
    clock, sent, record = Milestones(), 0, {}
    try:
        while (done := manager.current_step() * local_steps) < total:
            round_start = manager.current_step()
            for local in range(local_steps):
                position = min(done + local, total - 1)
                sampler.set_epoch(position // per_epoch)
                at_step(scheduler, position)
                indices = sampler.share(position % per_epoch, replica)
                step(exchange, pipeline.batch(indices), objective, len(indices))
            sent += exchange.stats().bytes_sent
            landed = manager.current_step() > round_start
            healed = manager.current_step() > round_start + 1  # behind the quorum: a peer's state replaced its own
            log.write({"kind": "round", "round": round_start, "at": time.time(), "committed": landed,
                       "healed": healed, "members": manager.num_participants(), "steps": local_steps,
                       "weight": manager.num_participants() * local_steps if landed else 0,
                       "digest": exchange.digest()})
            after = manager.current_step() * local_steps
            every = cfg.output.eval_every
            crossed = after // per_epoch > done // per_epoch or after >= total
            if writes and landed and (crossed or (every and after // every > done // every)):
                with clock.paused():
                    position = min(after, total)
                    epoch = -(-position // per_epoch) if crossed else position // per_epoch
                    record = evaluated(exchange, pipeline, objective, epoch, position, clock, sent, crossed)
                log.write(record)
            log.flush()
        if writes:
            report.write_summary(run_dir, {
                **{f"final_{k}": record[k] for k in ("test_loss", "test_acc", "test_perplexity") if k in record},
                "wall_time_s": time.time() - began, "train_s": clock.train_s(), "bytes_sent": sent,
                "epochs": cfg.recipe.epochs, "steps_per_epoch": per_epoch, "world_size": replicas,
                "run_dir": str(run_dir), "config": cfg.to_dict()})
        return 0
    finally:
        log.close()
        exchange.close()


def step(exchange: TorchftExchange, parts, objective: Objective, samples: int) -> None:
    """One inner step on this replica's share (its micro-batches, `samples` in all); torchft's hook synchronises
    where a round ends."""
    scale = samples * objective.predictions_per_sample
    for x, y in parts:
        with exchange.autocast():
            loss_sum, _ = objective(exchange.model(x), y)
        exchange.backward(global_batch_loss(loss_sum, 1, scale))
    exchange.step()
    exchange.optimizer.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> None:
    """Run one replica group (torchrun restarts it where it dies; it heals from a peer)."""
    parser = argparse.ArgumentParser(prog="python -m scalesgd.bench.elastic.torchft_replica", description=main.__doc__)
    parser.add_argument("--replica", type=int, required=True, help="this replica group's index (its data shard)")
    parser.add_argument("--replicas", type=int, required=True, help="the most replica groups (the data's shards)")
    parser.add_argument("--lighthouse", required=True, help="http://HOST:PORT of torchft_lighthouse")
    parser.add_argument("--min-replicas", type=int, default=1, help="the fewest a quorum takes (torchft's example: 1)")
    parser.add_argument("--run-dir", required=True, help="where this replica logs (replica 0: the run's records)")
    parser.add_argument("train", nargs=argparse.REMAINDER, help="-- then `scalesgd train` options")
    args = parser.parse_args(argv)
    if not 0 <= args.replica < args.replicas:
        parser.exit(2, f"{parser.prog}: error: --replica {args.replica}: give 0 to --replicas - 1 "
                       f"({args.replicas - 1})\n")
    if not args.lighthouse.startswith("http://"):
        parser.exit(2, f"{parser.prog}: error: --lighthouse {args.lighthouse}: give http://HOST:PORT\n")
    try:
        cfg = TrainConfig.from_argv([a for a in args.train if a != "--"])
    except UsageError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if cfg.periodic.peer != "torchft":
        parser.exit(2, f"{parser.prog}: error: give --peer torchft and its --local-steps among the train options\n")
    name_process(args.replica)  # found by the failure injector as our own launches' workers are
    group = ReplicaGroup(f"scalesgd_{args.replica}", args.lighthouse, args.min_replicas,
                         timedelta(seconds=COLLECTIVE_S), timedelta(seconds=HEAL_S), timedelta(seconds=QUORUM_S))
    sys.exit(train_replica(cfg, args.replica, args.replicas, group, Path(args.run_dir)))


if __name__ == "__main__":
    main()
