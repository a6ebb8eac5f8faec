"""`--exchange auto`, all of it: measure this run's compute, link and codecs on the real process group
(`auto_probe`), simulate every candidate exchange (codec × bucket plan, and the periodic modes bench quality measured)
and rank them by time to the target (`auto_rank`), try the finalists for real, and use the soonest; decided once at
start-up, on the whole model before it is laid out (kept on resume), and shown as a table (collective: every rank
calls `choose`)."""

from __future__ import annotations

import contextlib
import copy
import json
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scalesgd.comm.codecs import CODECS, Channel, CodecSettings
from scalesgd.comm.cost import link, profile
from scalesgd.comm.engine.buckets import BucketPlan, model_tensors, plan_from_groups
from scalesgd.comm.engine.exchange import build_exchange, parse_exchange
from scalesgd.comm.wire.collectives import broadcast_object
from scalesgd.comm.wire.groups import own_group
from scalesgd.config import TrainConfig, rules
from scalesgd.errors import option_name
from scalesgd.output import console as make_console
from scalesgd.output import rich_table, write_json
from scalesgd.runtime.process_group import DistEnv
from scalesgd.sim import quality
from scalesgd.sim.compute import from_layers, unit_names
from scalesgd.sim.exchange import predict
from scalesgd.sim.network import Cluster
from scalesgd.sim.quality import StepsToTarget
from scalesgd.train.auto_probe import contended_bucket_cost, probe
from scalesgd.train.auto_rank import (
    FINALIST_MARGIN,
    Candidate,
    candidate_mode,
    finalists,
    periodic_candidate,
    periodic_codec,
    periodic_options,
    periodic_settings,
    pick,
    proxy,
    steps_for,
    uncompressed,
)

PLANS = ("size:1", "size:4", "size:25", "planner:optimal")
AUTO_NAME = "auto.json"  # in a run directory: the decision a resumed run keeps


@dataclass(frozen=True)
class Weighed:
    """What auto weighs, and for what: the exchanges (names `parse_exchange` reads) with this run's codec settings and
    allreduce, in `group` (and the node groups), for a worker's micro-batch of `batch_per_worker` samples,
    `accumulate` of them a step; what bench quality measured (`steps_table`) and the periodic modes of it auto may
    choose (`periodic`: the options switching the run to each); `shard`: the sharded engine's scope ("" every rank's
    shards, "node" each node's; None: whole models) and `units`, the modules it shards."""

    exchanges: tuple[str, ...]
    settings: CodecSettings
    algorithm: str
    group: object
    topology: object
    procs_per_node: int
    batch_per_worker: int
    accumulate: int = 1
    steps_table: dict[str, StepsToTarget] = field(default_factory=dict)
    periodic: dict[str, dict] = field(default_factory=dict)
    shard: str | None = None
    units: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """The way auto chose (`chosen`: an exchange in a bucket plan, or a periodic mode), every candidate's prediction,
    the finalists tried and their measured iterations, and the periodic modes it could only list."""

    chosen: Candidate
    table: list[Candidate]
    finalists: list[Candidate] = field(default_factory=list)  # best first
    measured: list[float] = field(default_factory=list)  # each finalist's trial iteration ([]: chosen by the model)
    periodic: list[dict] = field(default_factory=list)  # {"mode", "options", "to_target_s"}: listed, not chosen
    link: dict = field(default_factory=dict)  # the links measured on the run's group ({"inter"/"intra": LinkCost's})
    steps_under: str = ""  # the optimizer whose steps to the target ranked the candidates ("": the model's own)

    @property
    def measured_s(self) -> float | None:
        """The chosen exchange's trial iteration (None: chosen by the model alone)."""
        key = (self.chosen.exchange, self.chosen.plan, self.chosen.mode)  # not its prediction: a saved one may differ
        return next((m for f, m in zip(self.finalists, self.measured) if (f.exchange, f.plan, f.mode) == key), None)

    @property
    def compresses(self) -> bool:
        """Whether the chosen exchange sends less than fp32 every step (auto says so when it does not)."""
        return self.chosen.periodic or not uncompressed(self.chosen.exchange)

    def to_dict(self) -> dict:
        """auto.json and summary.json's record: the choice by its exchange (`codec`), plan (`buckets`) or periodic
        `mode` and the options switching the run to it (`settings`), then everything weighed."""
        c = self.chosen
        return {"codec": c.exchange, "buckets": c.plan, "mode": c.mode, "groups": [list(g) for g in c.groups],
                "settings": c.settings or {}, "chosen": c.to_dict(groups=True), "compresses": self.compresses,
                "predicted_s": c.iteration_s,
                "trial_s": self.measured_s,
                "finalists": [f.to_dict(groups=True) | ({"measured_s": m} if self.measured else {})
                              for f, m in zip(self.finalists, self.measured or [None] * len(self.finalists))],
                "candidates": [row.to_dict() for row in self.table], "periodic": self.periodic, "link": self.link,
                "steps_under": self.steps_under}

    @classmethod
    def from_dict(cls, d: dict) -> Decision:
        """What `to_dict` wrote (or an earlier version, which kept a periodic mode in `buckets`)."""
        finals = [Candidate.from_dict(f) for f in d.get("finalists", [])]
        measured = [f["measured_s"] for f in d.get("finalists", []) if "measured_s" in f]
        if "chosen" in d:
            chosen = Candidate.from_dict(d["chosen"])
        else:  # an earlier version's: the choice by its fields
            settings = d.get("settings") or None
            chosen = Candidate(d["codec"], d["predicted_s"], 0.0, "" if settings else d["buckets"],
                               tuple(map(tuple, d["groups"])), mode=d["buckets"] if settings else "",
                               settings=settings)
            chosen = next((f for f in finals if (f.exchange, f.plan) == (chosen.exchange, chosen.plan)), chosen)
        return cls(chosen, [Candidate.from_dict(row) for row in d["candidates"]], finals,
                   measured if len(measured) == len(finals) else [], d.get("periodic", []), d.get("link", {}),
                   d.get("steps_under", ""))

    def tried(self, measured_s: list[float]) -> Decision:
        """The finalist measured soonest to the target (`measured_s`: each finalist's trial iteration, in order, × its
        steps to the target)."""
        best = min(zip(self.finalists, measured_s), key=lambda fm: quality.per_reference_step(fm[1],
                                                                                              fm[0].steps_factor))
        return replace(self, chosen=best[0], measured=list(measured_s))


def decide(model: nn.Module, batch, loss_fn, weighed: Weighed) -> Decision:
    """Profile, measure, simulate, choose (collective); rank 0's choice is every rank's.

    Candidates are ranked by predicted time to the target: the predicted iteration × the steps to the target over
    DDP fp32's that `bench quality` measured for the model's family (1 where none was), and one that missed the
    target is never chosen; the periodic modes auto may choose are ranked alike, their iteration a round's share.

    A DDP exchange is costed by the codec of ours that does its work (DDP's allreduce by fp32, its fp16 hook by
    fp16, PowerSGD by lowrank), on DDP's buckets and gloo's or NCCL's own allreduce; the trial then measures it for
    real. On shards (`weighed.shard`), `model` is the whole model before it is sharded into `weighed.units`, and each
    codec is costed on the shards' sums unit by unit; the model alone chooses (no trial).
    """
    w = weighed
    device = next(model.parameters()).device
    compute = replace(from_layers(profile.layer_profile(model, batch, loss_fn, w.group), 0.0, w.batch_per_worker),
                      accumulate=w.accumulate, units=w.units)
    world = dist.get_world_size(w.group)
    links = link.measure_topology(world, w.procs_per_node, group=w.group)
    inter, intra = links["inter"], links["intra"]
    cluster = Cluster(world // w.procs_per_node, w.procs_per_node, inter or intra, intra or inter)
    channel = Channel(w.group, world, w.algorithm, w.topology)
    handoff = contended_bucket_cost(model, batch, loss_fn, channel, cluster)
    costs = {}
    for name in (*w.exchanges, *map(periodic_codec, w.periodic.values())):
        does_work = proxy(name)
        if does_work not in costs:
            measured = probe(does_work, w.settings, channel, cluster, compute, device)
            costs[does_work] = replace(measured, channel_s_per_bucket=max(measured.channel_s_per_bucket, handoff),
                                       fsdp_backend="nccl" if device.type == "cuda" else "gloo")
    decision = None
    if dist.get_rank() == 0:
        table = []
        for name in w.exchanges:
            engine, codec = parse_exchange(name)
            plans = ("units",) if w.shard is not None else ("ddp",) if engine == "ddp" else (
                (CODECS[codec].buckets,) if CODECS[codec].buckets else PLANS)
            steps = w.steps_table.get(quality.key_of(engine, codec))
            for plan in plans:
                p = predict(candidate_mode(name, w.settings, w.algorithm, plan, w.shard), compute, cluster,
                            costs[proxy(name)])
                table.append(Candidate(name, p.iteration_s, p.exposed_comm_s, plan, tuple(map(tuple, p.groups)),
                                       None if steps is None or steps.missed else steps.factor,
                                       bool(steps and steps.missed)))
        for key, options in w.periodic.items():
            table.append(periodic_candidate(w.steps_table[key], options, compute, cluster,
                                            costs[proxy(periodic_codec(options))]))
        best = pick(table)
        decision = Decision(best, table, finalists(table, best) if not best.periodic and w.shard is None else [],
                            periodic=periodic_options(w.steps_table, compute, cluster, costs, w.periodic)
                            if w.shard != "" else [],  # every rank's shards: no node to synchronise periodically
                            link={"inter": cluster.inter.to_dict(), "intra": cluster.intra.to_dict()})
    return broadcast_object(decision, group=w.group)


TRIAL_WARMUP = 2  # untimed iterations per finalist (kernels, a sparse codec's first threshold)
TRIAL_ROUNDS, TRIAL_PER_ROUND = 4, 3  # finalists take turns, so a slow spell of the machine hits them all; 12
# timed steps each (6 put fp16 ahead of fp8 at 100 Mbit/s, where whole runs took 0.27 and 0.23 s a step)


def choose(cfg: TrainConfig, model: torch.nn.Module, batches: list, loss_fn, env: DistEnv, run_dir: Path | None,
           resume: bool, quiet: bool = False) -> tuple[TrainConfig, BucketPlan | None, dict]:
    """The config with auto's choice, its bucket plan (None for a periodic mode or the sharded engine's units), and
    the decision's record (collective). Decided once, on the whole model before it is laid out: the codec decides
    how a sharded engine shards it.

    The model ranks every candidate; the finalists it cannot tell apart are then run for real on copies of
    the model over `batches`, and the one measured fastest is used. A resumed run keeps the decision it
    started with: its codec state belongs to that exchange.
    """
    saved = run_dir / AUTO_NAME if run_dir is not None else None
    if resume and saved is not None and saved.exists():
        decision = Decision.from_dict(json.loads(saved.read_text()))
    else:
        x = cfg.exchange
        optimizer, steps_table = steps_for(cfg)
        weighed = Weighed(rules.auto_fitting(cfg)[0], cfg.codec_settings(), x.algorithm, env.exchange_group,
                          env.topology_groups, x.procs_per_node or env.local_world_size, cfg.micro_batch,
                          cfg.recipe.accumulate, steps_table,
                          {key: settings for key, steps in steps_table.items()
                           if not x.sharded and (settings := periodic_settings(steps, cfg)) is not None},
                          ("node" if x.hybrid else "") if x.sharded else None,
                          unit_names(model, cfg.model.name) if x.sharded else ())
        decision = replace(decide(model, batches[0], loss_fn, weighed), steps_under=optimizer)
        if len(decision.finalists) > 1:
            decision = decision.tried(trial(cfg, model, batches, loss_fn, env, decision.finalists))
        if env.is_main and saved is not None:
            write_json(saved, decision.to_dict())
    if env.is_main and not quiet:
        show(decision)
    chosen = decision.chosen
    engine, codec = parse_exchange(chosen.exchange)
    engine = cfg.exchange.engine if cfg.exchange.sharded else engine  # on shards: the codec on the sharded engine
    switched = cfg.replaced(**{"engine": engine, "codec": codec, "buckets": "size:1", **(chosen.settings or {})})
    if chosen.periodic or cfg.exchange.sharded:  # a pseudo-gradient travels whole; shards' sums go unit by unit
        return switched, None, decision.to_dict()
    plan = plan_from_groups([list(g) for g in chosen.groups], model_tensors(model), f"auto:{chosen.plan}")
    return switched, plan, decision.to_dict()


def trial(cfg: TrainConfig, model: torch.nn.Module, batches: list, loss_fn, env: DistEnv,
          finalists: list[Candidate]) -> list[float]:
    """Each finalist's median iteration (slowest rank's), run in turns on its own copy of the model (collective).

    Each runs compressed from its first step (PyTorch's PowerSGD after its own plain start, untimed), in a process
    group of its own, with this run's optimizer; the copies and their exchanges are dropped after, so the run starts
    from the weights it had.
    """
    runs, warmups = [], []
    for finalist in finalists:
        net = copy.deepcopy(model)
        engine, codec = parse_exchange(finalist.exchange)
        setup = cfg.replaced(engine=engine, codec=codec, compress_after="0", density_warmup=0).exchange_setup(
            own_group(), env.topology_groups,
            plan=plan_from_groups([list(g) for g in finalist.groups], model_tensors(net), f"auto:{finalist.plan}"))
        runs.append(build_exchange(engine, net, cfg.build_optimizer(net), setup))
        warmups.append(TRIAL_WARMUP + CODECS[codec].warm_start)
    times: list[list[float]] = [[] for _ in runs]
    for exchange, warmup in zip(runs, warmups):
        for i in range(warmup):
            _step(exchange, batches[i % len(batches)], loss_fn, cfg.recipe.accumulate)
    for _ in range(TRIAL_ROUNDS):
        for exchange, took in zip(runs, times):
            dist.barrier()
            took += [_step(exchange, batches[i % len(batches)], loss_fn, cfg.recipe.accumulate)
                     for i in range(TRIAL_PER_ROUND)]
    for exchange in runs:
        exchange.close()
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return [statistics.median(row) for row in slowest.tolist()]


def _step(exchange, batch, loss_fn, accumulate: int = 1) -> float:
    """One training iteration through `exchange`: `accumulate` forward and backward passes of `batch`, the last one
    exchanging, then the step; its seconds on this rank."""
    x, y = batch
    start = time.perf_counter()
    for micro in range(accumulate):
        with exchange.no_sync() if micro < accumulate - 1 else contextlib.nullcontext():
            loss_fn(exchange.model(x), y).backward()
    exchange.optimizer.step()
    exchange.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _factor_text(c: Candidate) -> str:
    if c.missed:
        return "missed the target (bench quality)"
    return "1 (not measured)" if c.steps_factor is None else f"{c.steps_factor:.2f}"


def show(decision: Decision) -> None:
    """The predicted iteration of every candidate, the chosen one first; then the finalists' trials."""
    rows = sorted(decision.table, key=lambda c: (c.missed, c.to_target_s))
    console = make_console()
    chosen = decision.chosen
    plan = {"ddp": "DDP's own buckets", "units": "each unit's sum on the shards"}.get(chosen.plan,
                                                                                    f"buckets {chosen.plan}")
    chose = f"{chosen.exchange} with {plan}" if not chosen.periodic else (
        f"periodic synchronisation {chosen.mode} (" + " ".join(f"{option_name(k)} {v}" for k, v in
                                                               chosen.settings.items()) + ")")
    console.print(rich_table(f"--exchange auto chose {chose}"
                             + (": no compression pays here" if not decision.compresses else ""),
                             ["codec", "buckets or mode", "predicted ms", "exposed ms",
                              f"steps to target × DDP's{f' ({decision.steps_under})' if decision.steps_under else ''}",
                              "to target: ms per DDP step"],
                             [[c.exchange, c.shown, f"{1e3 * c.iteration_s:.1f}", f"{1e3 * c.exposed_comm_s:.1f}",
                               _factor_text(c), "never chosen" if c.missed else f"{1e3 * c.to_target_s:.1f}"]
                              for c in rows]))
    best = next((c for c in decision.table if c == chosen), chosen).to_target_s
    sooner = [r for r in decision.periodic if r["to_target_s"] < best * (1 - FINALIST_MARGIN)]
    if sooner:
        console.print(rich_table("periodic synchronisation, predicted sooner to the target (bench quality's options)",
                                 ["mode", "train options", "to target: ms per DDP step"],
                                 [[r["mode"], r["options"], f"{1e3 * r['to_target_s']:.1f}"] for r in sooner]))
    if decision.measured:
        console.print(rich_table("finalists run for real", ["codec", "buckets", "predicted ms", "measured ms"],
                                 [[f.exchange, f.plan, f"{1e3 * f.iteration_s:.1f}", f"{1e3 * m:.1f}"]
                                  for f, m in zip(decision.finalists, decision.measured)]))
