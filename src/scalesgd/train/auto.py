"""`--exchange auto`, all of it: measure this run's compute, link and codecs on the real process group, simulate
every candidate exchange (codec × bucket plan) and rank them, try the finalists for real, and use the fastest;
decided once at start-up (kept on resume) and shown as a table (collective: every rank calls `choose`)."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scalesgd.comm.codecs import CODECS, Channel, CodecSettings, make_codec
from scalesgd.comm.cost import link, profile
from scalesgd.comm.cost.profile import fit_line
from scalesgd.comm.engine.buckets import BucketPlan, model_tensors, plan_from_groups
from scalesgd.comm.engine.driver import BucketDriver
from scalesgd.comm.engine.exchange import build_exchange, parse_exchange
from scalesgd.comm.wire.collectives import broadcast_object
from scalesgd.comm.wire.groups import own_group
from scalesgd.config import TrainConfig, rules
from scalesgd.errors import option_name
from scalesgd.output import console as make_console
from scalesgd.output import rich_table, write_json
from scalesgd.runtime.process_group import DistEnv
from scalesgd.sim import quality
from scalesgd.sim.compute import ComputeProfile, from_layers, unit_names
from scalesgd.sim.exchange import Costs, predict, sent_sizes
from scalesgd.sim.modes import Mode
from scalesgd.sim.network import Cluster
from scalesgd.sim.quality import StepsToTarget
from scalesgd.sim.wire import wire_time
from scalesgd.train.auto_rank import (
    FINALIST_MARGIN,
    _uncompressed,
    candidate_mode,
    finalists,
    periodic_codec,
    periodic_options,
    periodic_row,
    periodic_settings,
    pick,
    proxy,
    to_target,
)

PLANS = ("size:1", "size:4", "size:25", "planner:optimal")
PROBE_SIZES = (1 << 12, 1 << 22)  # the buckets each candidate codec exchanges for real: 16 KB and 16 MB of fp32
PROBE_REPEATS = 2
HANDOFF_ELEMENTS, HANDOFF_BUCKETS = 1024, 16  # small buckets exchanged while backward runs
AUTO_NAME = "auto.json"  # in a run directory: the decision a resumed run keeps


@dataclass(frozen=True)
class Decision:
    """The exchange auto chose, every candidate's predicted iteration, and the finalists' measured ones."""

    codec: str
    buckets: str
    groups: list[list[int]]  # the chosen plan's layer groups (backward order)
    predicted_s: float
    table: list[dict]  # {"codec", "buckets", "iteration_s", "exposed_comm_s", "buckets_n"} for every candidate
    finalists: list[dict] = field(default_factory=list)  # {"codec", "buckets", "groups", "predicted_s"}, best first
    measured_s: float | None = None  # the chosen exchange's trial iteration (None: chosen by the model alone)
    periodic: list[dict] = field(default_factory=list)  # {"mode", "options", "to_target_s"}: listed, not chosen
    settings: dict = field(default_factory=dict)  # the chosen periodic mode's options by flat name; {}: every step

    def to_dict(self) -> dict:
        return {"codec": self.codec, "buckets": self.buckets, "groups": self.groups, "compresses": self.compresses,
                "predicted_s": self.predicted_s, "trial_s": self.measured_s, "finalists": self.finalists,
                "candidates": self.table, "periodic": self.periodic, "settings": self.settings}

    @classmethod
    def from_dict(cls, d: dict) -> Decision:
        return cls(d["codec"], d["buckets"], d["groups"], d["predicted_s"], d["candidates"], d.get("finalists", []),
                   d.get("trial_s"), d.get("periodic", []), d.get("settings", {}))

    @property
    def compresses(self) -> bool:
        """Whether the chosen exchange sends less than fp32 every step (auto says so when it does not)."""
        return bool(self.settings) or not _uncompressed(self.codec)

    def tried(self, measured_s: list[float]) -> Decision:
        """The finalist measured soonest to the target (`measured_s`: each finalist's trial iteration, in order, × its
    steps to the target)."""
        finalists = [f | {"measured_s": m} for f, m in zip(self.finalists, measured_s)]
        best = min(finalists, key=lambda f: f["measured_s"] * (f.get("steps_factor") or 1.0))
        return replace(self, codec=best["codec"], buckets=best["buckets"], groups=best["groups"],
                       predicted_s=best["predicted_s"], finalists=finalists, measured_s=best["measured_s"])


def decide(model: nn.Module, batch, loss_fn, candidates: tuple[str, ...], settings: CodecSettings, algorithm: str,
           group, topology, procs_per_node: int, batch_per_worker: int, accumulate: int = 1,
           steps_table: dict[str, StepsToTarget] | None = None, periodic: dict[str, dict] | None = None,
           layout: str | None = None, units: tuple[str, ...] = ()) -> Decision:
    """Profile, measure, simulate, choose (collective); rank 0's choice is every rank's.

    Candidates are ranked by predicted time to the target: the predicted iteration × the steps to the target over
    DDP fp32's that `bench quality` measured for the model's family (`steps_table`; 1 where none was), and one that
    missed the target is never chosen. `periodic` names the table's periodic modes auto may choose (key: the options
    that switch the run to it): each is ranked alike, its iteration a round's share.

    `candidates` name exchanges (`parse_exchange`): our codecs, and DDP's. A DDP exchange is costed by the codec of
    ours that does its work (DDP's allreduce by fp32, its fp16 hook by fp16, PowerSGD by lowrank), on
    DDP's buckets and gloo's or NCCL's own allreduce; the trial then measures it for real.

    With a `layout` (the sharded engine's: "" or "node"), `model` is the whole model before it is sharded into
    `units`, and each codec is costed on the shards' sums unit by unit; the model alone chooses (no trial).
    """
    device = next(model.parameters()).device
    compute = replace(from_layers(profile.layer_profile(model, batch, loss_fn, group), 0.0, batch_per_worker),
                      accumulate=accumulate, units=units)
    world = dist.get_world_size(group)
    links = link.measure_topology(world, procs_per_node, group=group)
    inter, intra = links["inter"], links["intra"]
    cluster = Cluster(world // procs_per_node, procs_per_node, inter or intra, intra or inter)
    channel = Channel(group, world, algorithm, topology)
    handoff = contended_bucket_cost(model, batch, loss_fn, channel, cluster)
    periodic = periodic or {}
    costs = {}
    for name in (*candidates, *map(periodic_codec, periodic.values())):
        does_work = proxy(name)
        if does_work not in costs:
            measured = probe(does_work, settings, channel, cluster, compute, device)
            costs[does_work] = replace(measured, channel_s_per_bucket=max(measured.channel_s_per_bucket, handoff),
                                       fsdp_backend="nccl" if device.type == "cuda" else "gloo")
    decision = None
    if dist.get_rank() == 0:
        table = []
        for name in candidates:
            engine, codec = parse_exchange(name)
            plans = ("units",) if layout is not None else ("ddp",) if engine == "ddp" else (
                (CODECS[codec].buckets,) if CODECS[codec].buckets else PLANS)
            for plan in plans:
                p = predict(candidate_mode(name, settings, algorithm, plan, layout), compute, cluster,
                            costs[proxy(name)])
                steps = (steps_table or {}).get(quality.key_of(engine, codec))
                factor = None if steps is None or steps.missed else steps.factor
                table.append({"codec": name, "buckets": plan, "iteration_s": p.iteration_s,
                              "exposed_comm_s": p.exposed_comm_s, "groups": p.groups, "steps_factor": factor,
                              "missed": bool(steps and steps.missed),
                              "to_target_s": p.iteration_s * (factor or 1.0)})
        for key, options in periodic.items():
            cost = costs[proxy(periodic_codec(options))]
            table.append(periodic_row(steps_table[key], options, compute, cluster, cost))
        best = pick(table)
        decision = Decision(best["codec"], best["buckets"], best["groups"], best["iteration_s"],
                            [{k: v for k, v in row.items() if k != "groups"} | {"buckets_n": len(row["groups"])}
                             for row in table],
                            [{"codec": r["codec"], "buckets": r["buckets"], "groups": r["groups"],
                              "predicted_s": r["iteration_s"], "steps_factor": r["steps_factor"]}
                             for r in finalists(table, best)] if "settings" not in best and layout is None else [],
                            periodic=periodic_options(steps_table or {}, compute, cluster, costs, periodic)
                            if layout != "" else [],  # every rank's shards: no node to synchronise periodically
                            settings=best.get("settings", {}))
    return broadcast_object(decision, group=group)


def contended_bucket_cost(model: nn.Module, batch, loss_fn, channel: Channel, cluster: Cluster) -> float:
    """What one more bucket costs the channel while backward computes beside it, beyond its wire (collective).

    The engine's communication thread wakes once per bucket; where compute holds the cores, each wake-up
    waits for them. Small fp32 buckets are exchanged on a thread while this thread runs forward and backward,
    as in training; the model's state (BN statistics) is put back after.
    """
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = batch
    bucket = torch.randn(HANDOFF_ELEMENTS, device=x.device)
    took: list[float] = []

    def exchange() -> None:
        start = time.perf_counter()
        for _ in range(HANDOFF_BUCKETS):
            channel.allreduce(bucket.clone())
        took.append(time.perf_counter() - start)

    dist.barrier(group=channel.group)
    worker = threading.Thread(target=exchange, name="scalesgd-auto-probe")
    worker.start()
    loss_fn(model(x), y).backward()
    while worker.is_alive():  # compute for as long as the exchanges take
        loss_fn(model(x), y).backward()
    worker.join()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)
    wire = wire_time(Mode("fp32", "scalesgd", "fp32", channel.algorithm), HANDOFF_ELEMENTS, cluster)
    per_bucket = torch.tensor([max(took[0] / HANDOFF_BUCKETS - wire, 0.0)], dtype=torch.float64)
    dist.all_reduce(per_bucket, op=dist.ReduceOp.MAX, group=channel.group)
    return per_bucket.item()


def probe(codec_name: str, settings: CodecSettings, channel: Channel, cluster: Cluster, compute: ComputeProfile,
          device) -> Costs:
    """Buckets of two sizes exchanged for real with `codec_name`: what a bucket costs beyond the modelled wire, as a
    fixed part and a part per element, and the CPU the whole model's exchange would take (the slowest rank's;
    collective). Each bucket holds one square-ish matrix, which a low-rank codec factors."""
    mode = candidate_mode(codec_name, settings, channel.algorithm, "single")
    sizes = sorted({max(1, min(n, compute.numel)) for n in PROBE_SIZES})
    beyond, inline, cpu = [], 0.0, 0.0
    for numel in sizes:
        shape = matrix_shape(numel)
        took_inline, took, took_cpu = _exchange_for_real(codec_name, settings, channel, shape, device)
        sent = sent_sizes(mode, ComputeProfile(("probe",), (numel,), 0.0, (0.0,), 0.0, 1, shapes=(shape,)))[0]
        beyond.append(max(took - took_inline - wire_time(mode, sent, cluster), 0.0))
        inline, cpu = took_inline / numel, took_cpu / numel  # the largest bucket's, per element
    per_bucket, per_element = fit_line(sizes, beyond) if len(sizes) > 1 else (0.0, beyond[0] / sizes[0])
    return Costs(per_element, inline, cpu * compute.numel, per_bucket)


def matrix_shape(numel: int) -> tuple[int, int]:
    """A probe's `numel` elements as a matrix, rows a power of two up to its square root (a low-rank codec factors
    it as it would a layer's weight)."""
    rows = math.gcd(numel, 1 << (max(numel.bit_length() - 1, 0) // 2))
    return (rows, numel // rows)


def _exchange_for_real(codec_name: str, settings: CodecSettings, channel: Channel, shape: tuple[int, ...],
                       device) -> tuple[float, float, float]:
    """Seconds on backward's path, in all, and of process CPU for one bucket holding one tensor of `shape` (slowest
    rank's, collective).

    Each repeat starts from a fresh codec: the same gradient fed twice would double a sparse codec's residual
    and send many times its density. A codec that reuses its threshold computes the exact top-k on one step
    in `reuse`: that share of the selection is taken out of the times.
    """
    weight = torch.randn(shape, device=device)
    numel = weight.numel()
    gradient = torch.randn(numel, device=device) * 1e-3
    inline = total = cpu = 0.0
    for repeat in range(PROBE_REPEATS + 1):  # the first warms the codec up (kernels, scales)
        codec = make_codec(codec_name, settings)
        driver = BucketDriver(codec, channel)
        view = driver.view(0, [weight], [0], numel)
        flat = gradient.clone()
        dist.barrier(group=channel.group)
        start, cpu_start = time.perf_counter(), time.process_time()
        pending = driver.prepare(flat, view)
        encoded = time.perf_counter()
        driver.complete(pending)
        end, cpu_end = time.perf_counter(), time.process_time()
        saved = _reused_share(codec, gradient)
        if repeat:
            inline += (encoded - start - saved) if codec.encode_in_backward else 0.0
            total += end - start - saved
            cpu += cpu_end - cpu_start - saved
    measured = torch.tensor([inline, total, cpu], dtype=torch.float64) / PROBE_REPEATS
    dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=channel.group)
    return tuple(max(t, 0.0) for t in measured.tolist())


def _reused_share(codec, gradient: torch.Tensor) -> float:
    """The exact top-k's time a codec reusing its threshold for `reuse` steps saves on average per step."""
    reuse = getattr(codec, "reuse", 1)
    if reuse <= 1:
        return 0.0
    start = time.perf_counter()
    torch.topk(gradient.abs(), codec.k(gradient.numel()), sorted=False)
    return (time.perf_counter() - start) * (reuse - 1) / reuse


TRIAL_WARMUP = 2  # untimed iterations per finalist (kernels, a sparse codec's first threshold)
TRIAL_ROUNDS, TRIAL_PER_ROUND = 4, 3  # finalists take turns, so a slow spell of the machine hits them all; 12
# timed steps each (6 put fp16 ahead of fp8 at 100 Mbit/s, where whole runs took 0.27 and 0.23 s a step)


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
        x = cfg.exchange
        fitting = rules.auto_fitting(cfg)[0]  # what manual mode would run with this optimizer and options
        steps_table = quality.table(quality.family_of(cfg.data.text))
        periodic = {key: settings for key, steps in steps_table.items()
                    if not x.sharded and (settings := periodic_settings(steps, cfg)) is not None}
        layout = ("node" if x.hybrid else "") if x.sharded else None
        decision = decide(model, batches[0], loss_fn, fitting, cfg.codec_settings(), x.algorithm,
                          env.exchange_group, env.topology_groups, x.procs_per_node or env.local_world_size,
                          cfg.micro_batch, cfg.recipe.accumulate, steps_table, periodic, layout,
                          unit_names(model, cfg.model.name) if x.sharded else ())
        if len(decision.finalists) > 1:
            decision = decision.tried(trial(cfg, model, batches, loss_fn, env, decision.finalists))
        if env.is_main and saved is not None:
            write_json(saved, decision.to_dict())
    if env.is_main and not quiet:
        show(decision)
    engine, codec = parse_exchange(decision.codec)
    engine = cfg.exchange.engine if cfg.exchange.sharded else engine  # on shards: the codec on the sharded engine
    chosen = cfg.replaced(**{"engine": engine, "codec": codec, "buckets": "size:1", **decision.settings})
    if decision.settings or cfg.exchange.sharded:  # a pseudo-gradient travels whole; shards' sums go unit by unit
        return chosen, None, decision.to_dict()
    plan = plan_from_groups(decision.groups, model_tensors(model), f"auto:{decision.buckets}")
    return chosen, plan, decision.to_dict()


def trial(cfg: TrainConfig, model: torch.nn.Module, batches: list, loss_fn, env: DistEnv,
          finalists: list[dict]) -> list[float]:
    """Each finalist's median iteration (slowest rank's), run in turns on its own copy of the model (collective).

    Each runs compressed from its first step (PyTorch's PowerSGD after its own plain start, untimed), in a process
    group of its own, with this run's optimizer; the copies and their exchanges are dropped after, so the run starts
    from the weights it had.
    """
    runs, warmups = [], []
    for finalist in finalists:
        net = copy.deepcopy(model)
        engine, codec = parse_exchange(finalist["codec"])
        setup = cfg.replaced(engine=engine, codec=codec, compress_after="0", density_warmup=0).exchange_setup(
            own_group(), env.topology_groups,
            plan=plan_from_groups(finalist["groups"], model_tensors(net), f"auto:{finalist['buckets']}"))
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


def _factor_text(row: dict) -> str:
    if row.get("missed"):
        return "missed the target (bench quality)"
    factor = row.get("steps_factor")
    return "1 (not measured)" if factor is None else f"{factor:.2f}"


def show(decision: Decision) -> None:
    """The predicted iteration of every candidate, the chosen one first; then the finalists' trials."""
    rows = sorted(decision.table, key=lambda r: (r.get("missed", False), to_target(r)))
    console = make_console()
    buckets = {"ddp": "DDP's own buckets", "units": "each unit's sum on the shards"}.get(decision.buckets,
                                                                                       f"buckets {decision.buckets}")
    chose = f"{decision.codec} with {buckets}" if not decision.settings else (
        f"periodic synchronisation {decision.buckets} (" + " ".join(f"{option_name(k)} {v}" for k, v in
                                                                   decision.settings.items()) + ")")
    console.print(rich_table(f"--exchange auto chose {chose}"
                             + (": no compression pays here" if not decision.compresses else ""),
                             ["codec", "buckets or mode", "predicted ms", "exposed ms", "steps to target × DDP's",
                              "to target: ms per DDP step"],
                             [[r["codec"], r["buckets"], f"{1e3 * r['iteration_s']:.1f}",
                               f"{1e3 * r['exposed_comm_s']:.1f}", _factor_text(r),
                               "never chosen" if r.get("missed") else f"{1e3 * to_target(r):.1f}"] for r in rows]))
    best = to_target(next(r for r in decision.table if r["codec"] == decision.codec
                          and r["buckets"] == decision.buckets))
    sooner = [r for r in decision.periodic if r["to_target_s"] < best * (1 - FINALIST_MARGIN)]
    if sooner:
        console.print(rich_table("periodic synchronisation, predicted sooner to the target (bench quality's options)",
                                 ["mode", "train options", "to target: ms per DDP step"],
                                 [[r["mode"], r["options"], f"{1e3 * r['to_target_s']:.1f}"] for r in sooner]))
    tried = [f for f in decision.finalists if "measured_s" in f]
    if tried:
        console.print(rich_table("finalists run for real", ["codec", "buckets", "predicted ms", "measured ms"],
                                 [[f["codec"], f["buckets"], f"{1e3 * f['predicted_s']:.1f}",
                                   f"{1e3 * f['measured_s']:.1f}"] for f in tried]))
