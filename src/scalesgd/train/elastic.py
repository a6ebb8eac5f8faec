"""One member of an elastic periodic run (`scalesgd train --local-steps H --elastic`), the training path in one
sitting: each member steps alone on the shares the round deals it (`data.shares`), at the learning rate of the
global step those shares belong to, and every H steps `DiLoCo` takes the round among whoever is alive. Between rounds
nothing crosses between members: no per-window sums, evaluation or checkpoint collectives. The round's first member
holding the global state writes the run's records — its own steps' losses, each round's members, retries and digest,
evaluations of the global model on the whole test set — and the checkpoint: the global state alone, written where
it runs (nothing crosses the link for it); a member's local parameters and inner optimizer state are its own, and a
member that starts again heals from a peer, behind the rounds (dealt no shares until its state lands)."""

from __future__ import annotations

import faulthandler
import hashlib
import json
import signal
import time
from pathlib import Path

import torch

from scalesgd.comm.codecs import make_codec
from scalesgd.comm.engine.exchange import LocalExchange
from scalesgd.config import TrainConfig
from scalesgd.data import GlobalBatchSampler
from scalesgd.data.pipeline import MemoryPipeline
from scalesgd.data.shares import Dealer, round_shares
from scalesgd.elastic import ElasticMembership
from scalesgd.elastic.membership import SLOW_TOLERANCE
from scalesgd.elastic.outcomes import DivergedError
from scalesgd.options import flatten, runtime_fields
from scalesgd.periodic.exchange import PeriodicExchange
from scalesgd.recipe import build_scheduler, global_batch_loss
from scalesgd.runtime.process_group import set_threads
from scalesgd.trace import Tracer
from scalesgd.train import checkpoint, metrics, report
from scalesgd.train.build import data_and_model
from scalesgd.train.evaluation import Milestones, evaluate
from scalesgd.train.loop import EVAL_BATCH
from scalesgd.train.objective import Objective, throughput_key
from scalesgd.train.rundir import (
    CHECKPOINT_NAME,
    METRICS_NAME,
    PREVIOUS_CHECKPOINT_NAME,
)

ADDRESS_ENV = "SCALESGD_COORDINATOR"  # the coordinator a launched member connects to
MEMBER_ENV = "SCALESGD_MEMBER"  # its name (the launcher's; the id adds a random suffix)
LEFT_OUT = ("run_dir", "resume", "quiet", "eval_every", "checkpoint_every", "sync_every", "report")


def member_config(cfg: TrainConfig) -> str:
    """What members must share to take rounds together: every option that changes what is computed, as a short
    readable line and a digest of them all."""
    runtime = runtime_fields(type(cfg))
    computed = {k: v for k, v in flatten(cfg).items() if k not in runtime and k not in LEFT_OUT}
    digest = hashlib.sha256(json.dumps(computed, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return (f"{cfg.model.name} on {cfg.data.dataset}, {cfg.runtime.workers} workers × batch {cfg.micro_batch}, "
            f"{cfg.exchange.codec} H{cfg.periodic.local_steps}, options {digest}")


def train_member(cfg: TrainConfig, run_dir: Path, address: str, name: str) -> dict | None:
    """Train as one member until the run's shares are all dealt; the summary where this member wrote the run's
    records at the end (else None)."""
    wall = time.perf_counter()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a member that hangs says where, when asked
    set_threads(cfg.runtime.threads)
    data, model = data_and_model(cfg)
    sampler = GlobalBatchSampler(len(data.train), cfg.recipe.batch_size, cfg.runtime.workers, 0, seed=cfg.recipe.seed)
    dealer = Dealer(sampler, cfg.recipe.epochs)
    per_sample = data.sequence_length or 1
    pipeline = MemoryPipeline(data, sampler, cfg.recipe.accumulate, torch.device("cpu"),
                              max(1, EVAL_BATCH // per_sample))
    objective = Objective(data.is_text, cfg.recipe.label_smoothing, data.sequence_length)
    optimizer = cfg.build_optimizer(model, len(sampler))
    scheduler = build_scheduler(optimizer, cfg.recipe.lr_schedule(len(sampler)).factor)
    saved = resumable(run_dir)
    if saved is not None:
        model.load_state_dict(saved["model"])
    settings = cfg.exchange_setup(None, None, Tracer(False), None, len(sampler)).settings
    make_codec(cfg.exchange.codec, settings)  # its kernels built before joining: the first round holds everyone
    membership = ElasticMembership.connect(address, name, member_config(cfg), start_workers=cfg.runtime.workers,
                                           group_timeout_s=min(cfg.runtime.timeout, 60.0),
                                           slow_tolerance=None if cfg.periodic.elastic_grace else SLOW_TOLERANCE,
                                           # a grace window leaves a member out often: healed behind, it would sit
                                           # out the next round too (the straggler run 171.9 s against 143.6 s)
                                           heal_behind=not cfg.periodic.elastic_grace)
    elastic = membership.elastic
    try:
        setup = cfg.exchange_setup(membership, None, Tracer(False), None, len(sampler))
        exchange = PeriodicExchange(LocalExchange(model, optimizer, setup), setup, cfg.periodic,
                                    resume=saved["elastic"] if saved is not None else None)
        rounds = exchange.diloco.elastic
        startup_s = time.perf_counter() - wall
        clock = training_clock(rounds, rounds.shared.get("train_s", 0.0))
        best = rounds.shared.get("best_test_acc", 0.0)
        record, trained = {}, 0
        epoch_sums = torch.zeros(3, dtype=torch.float64)  # loss, correct, predictions of this member's steps
        log, logged = None, None  # the last round whose record this member wrote (None: not the writer)
        while True:
            quorum = elastic.quorum
            start = rounds.shared.get("cursor", 0)
            wanted = rounds.plan_of(quorum.size)
            plan = dealer.round_plan(start, wanted)
            if not any(plan):
                break
            if plan != wanted:  # the run's last round, cut short for all: it ends at `DiLoCo.finish`, not a plan
                rounds.plan = ()
            rounds.shared["cursor"] = start + sum(plan)  # dealt: a joiner healed in this round goes on
            pending, healed, done = [], rounds.healed_from, exchange.diloco.rounds
            mine = round_shares(start, plan, quorum.rank)
            for share in mine:
                global_step = dealer.global_step(share)
                lr = at_step(scheduler, global_step)
                indices = dealer.indices(share)
                loss, correct = step(exchange, pipeline.batch(indices), objective, len(indices), rounds.shared,
                                     clock)
                trained += len(indices) * per_sample
                epoch_sums += torch.tensor([loss * len(indices) * per_sample, correct, len(indices) * per_sample])
                pending.append({"kind": "iter", "epoch": dealer.epoch_of(share), "iter": global_step + 1, "lr": lr,
                                "loss": loss})
            if not mine:  # planned none: its state is still crossing to it
                rounds.sit_out(average=plan != wanted)
            elif exchange.diloco.rounds == done:  # the run's last round, cut short: its mean lands now
                exchange.settle()
            if rounds.healed_from != healed:  # dropped while stopped, and healed: the run's clock and records
                clock = training_clock(rounds, rounds.shared["train_s"])
                best = rounds.shared.get("best_test_acc", best)
            cursor = rounds.shared["cursor"]
            last = not any(dealer.round_plan(cursor, rounds.plan_of(elastic.quorum.size)))
            if last:  # said at once: the launcher ends its workers that did not take the last round
                rounds.land(wait=True)
                elastic.finished(name, rounds.digest() if rounds.holds_state else "")
            if elastic.quorum.rank != rounds.writer:
                logged = None  # another member writes the records
                continue
            log = log or metrics.MetricsLog(run_dir / METRICS_NAME)
            if logged is None:  # the records' writer from here: its rounds the last writer did not write
                logged = max((r["round"] for r in metrics.read(run_dir / METRICS_NAME) if r["kind"] == "round"),
                             default=-1)
            for entry in pending:
                log.write(entry)
            unwritten = []  # the newest round alone, but where the writer changed: from the log's end
            for entry in reversed(rounds.log):
                if entry["round"] <= logged:
                    break
                unwritten.append(entry)
            for entry in reversed(unwritten):
                log.write({"kind": "round", **entry, "train_s": clock.train_s(),
                           "bytes_sent": exchange.diloco.bytes_sent})
                logged = entry["round"]
            crossed = cursor // dealer.per_epoch > start // dealer.per_epoch or last
            every = cfg.output.eval_every
            if crossed or (every and dealer.global_step(start) // every != dealer.global_step(cursor) // every):
                epoch = cfg.recipe.epochs if last else cursor // dealer.per_epoch if crossed else dealer.epoch_of(cursor)
                with clock.paused():
                    record = evaluated(exchange, pipeline, objective, epoch, dealer.global_step(cursor), clock,
                                       exchange.diloco.bytes_sent, crossed)
                    if crossed:  # this member's own samples of the epoch
                        record.update(train_loss=(epoch_sums[0] / epoch_sums[2]).item(),
                                      train_acc=(epoch_sums[1] / epoch_sums[2]).item())
                        epoch_sums.zero_()
                if crossed:
                    with clock.checkpointing():
                        save(run_dir, cfg, exchange, model, epoch)
                best = rounds.shared["best_test_acc"] = max(best, record["test_acc"])
                log.write(record)
            log.flush()
        if elastic.quorum.rank != rounds.writer:
            return None
        ended = ended_alike(elastic.final_digests(), rounds.digest())
        summary = {
            "final_test_acc": record.get("test_acc", best), "best_test_acc": best,
            **{f"final_{key}": record[key] for key in ("test_loss", "test_perplexity") if key in record},
            "wall_time_s": time.perf_counter() - wall, "startup_s": startup_s, "train_s": clock.train_s(),
            "bytes_sent": exchange.diloco.bytes_sent, "checkpoint_s": clock.checkpoint_s,  # this launch's
            "checkpoint_link_bytes": clock.checkpoint_link_bytes, "epochs": cfg.recipe.epochs,
            "epochs_trained": cfg.recipe.epochs, "steps_per_epoch": len(sampler), "peak_lr": cfg.recipe.peak_lr,
            "world_size": cfg.runtime.workers, "run_dir": str(run_dir),
            throughput_key(data.is_text): trained / max(clock.train_s(), 1e-9),  # this member's own
            "elastic": {**elastic_summary(rounds.log, exchange.diloco.rounds, rounds.digest()),
                        "members_at_end": ended},
            "config": cfg.to_dict(),
        }
        if log is not None:
            log.close()
        report.write_summary(run_dir, summary)
        report.plot_report(run_dir)
        return summary
    finally:
        elastic.close()


def training_clock(rounds, offset_s: float) -> Milestones:
    """The run's training clock continued from `offset_s`, which the member's pace is read on too (the writer's
    evaluations left out of both)."""
    clock = Milestones(offset_s=offset_s)
    rounds.timed_by(clock.train_s)
    return clock


def step(exchange: PeriodicExchange, parts, objective: Objective, samples: int, shared: dict,
         clock: Milestones) -> tuple[float, int]:
    """One inner step on `parts` (its share's micro-batches, `samples` in all), and the round where it is due: the
    member's own mean loss and correct predictions."""
    scale = samples * objective.predictions_per_sample
    total, right = 0.0, 0
    for x, y in parts:
        with exchange.autocast():
            loss_sum, correct = objective(exchange.model(x), y)
        exchange.backward(global_batch_loss(loss_sum, 1, scale))
        total += loss_sum.item()
        right += int(correct)
    shared["train_s"] = clock.train_s()  # what a member healed in this step's round continues from
    exchange.step()
    exchange.optimizer.zero_grad(set_to_none=True)
    return total / scale, right


def at_step(scheduler: torch.optim.lr_scheduler.LambdaLR, position: int) -> float:
    """Set the learning rate of the run's global step `position` (LambdaLR's factors), whatever steps this member
    took: the schedule counts the run's samples, not the members'. The rate set."""
    scheduler.last_epoch = position
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(position)
    return scheduler.optimizer.param_groups[0]["lr"]


def evaluated(exchange: PeriodicExchange, pipeline: MemoryPipeline, objective: Objective, epoch: int,
              iteration: int, clock: Milestones, sent: int, end_of_epoch: bool) -> dict:
    """The global model on the whole test set, by this member alone."""
    began = time.perf_counter()
    with exchange.evaluated():
        test = evaluate(exchange.model, pipeline.test_batches(0, 1), objective, None, exchange.autocast)
    exchange.model.train()
    return {"kind": "epoch" if end_of_epoch else "eval", "epoch": epoch, "iter": iteration, "train_s": clock.train_s(),
            "at": time.time(), "eval_s": time.perf_counter() - began, "bytes_sent": sent, **test}


def save(run_dir: Path, cfg: TrainConfig, exchange: PeriodicExchange, model, epoch: int) -> None:
    """The global state, once, where this member runs: the model with the global parameters, DiLoCo's state and
    the counters the members share (what `scalesgd train --resume` starts every member from)."""
    diloco = exchange.diloco
    with diloco.global_model():
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state = {"model": weights, "optimizer": {}, "scheduler": {}, "epoch": epoch, "rng": {}, "config": cfg.to_dict(),
             "elastic": {**diloco.state_dict(), "shared": dict(diloco.elastic.shared)}}
    checkpoint.save_atomic(state, run_dir / CHECKPOINT_NAME, keep_previous=run_dir / PREVIOUS_CHECKPOINT_NAME)


def resumable(run_dir: Path) -> dict | None:
    """The run's last elastic checkpoint where it has one."""
    if not (run_dir / CHECKPOINT_NAME).exists():
        return None
    state = checkpoint.load_latest(run_dir)
    return state if "elastic" in state else None


def ended_alike(said: dict[str, str], own: str) -> int:
    """How many members of the last round said they ended the run with this member's global state; DivergedError
    where one ended with another (the per-round check covers each round's start, this the run's end)."""
    others = {member: digest for member, digest in said.items() if digest != own}
    if others:
        raise DivergedError(f"the run's last members ended it with different global states: {own} here, "
                            f"{others} there")
    return len(said)


def elastic_summary(log: list[dict], rounds: int, digest: str) -> dict:
    """What summary.json says of the membership: rounds, retries, the fewest and most members of a round."""
    sizes = [len(entry["members"]) for entry in log] or [0]
    return {"rounds": rounds, "retries": sum(entry["retries"] for entry in log), "fewest_members": min(sizes),
            "most_members": max(sizes), "final_digest": digest}
