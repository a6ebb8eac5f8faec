"""`scalesgd bench train`: iteration time of every exchange mode side by side, in one run of workers.

Every mode gets its own copy of the model; modes take turns in rounds, so a slow spell of the
machine or the network hits all of them alike, and the baselines (PyTorch DDP fp32, DDP with
`fp16_compress_hook`, DDP with PowerSGD) are measured on the same hardware in the same minute. An image model
reads random images and labels; a language model (`--model gpt`) random byte sequences and their next tokens,
its loss the training loop's mean over every predicted token.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scalesgd import checks, testbed
from scalesgd.bench import train_report
from scalesgd.bench.launch import BenchLaunch
from scalesgd.comm.cost import link, planner, profile
from scalesgd.comm.codecs import CODECS
from scalesgd.comm.wire.groups import own_group
from scalesgd.comm.engine.exchange import GradientExchange
from scalesgd.config import AUTO_CODECS, NO_PLANNER, TrainConfig
from scalesgd.data.text import VOCAB_SIZE
from scalesgd.errors import UsageError
from scalesgd.models import MODEL_OPTIONS, MODELS, TEXT, ModelOptions, build_model
from scalesgd.options import expanded, flat_options, flatten, option, words
from scalesgd.recipe import build_sgd, initialize
from scalesgd.recipe.aggregation import global_batch_loss
from scalesgd.runtime import process_group
from scalesgd.train import auto as auto_exchange
from scalesgd.sim.modes import MODES_HELP, Mode, parse_mode
from scalesgd.train.exchange import open_exchange
from scalesgd.train.objective import Objective
from scalesgd.units import RATE

BATCHES = 8  # distinct synthetic batches each mode cycles through


@dataclass
class TrainBenchConfig(BenchLaunch):
    """`scalesgd bench train`: every exchange mode timed on the same model, data and workers."""

    workers: int = option(2, "local workers; under torchrun the launch decides", check=checks.local_workers)
    model: str = option("resnet20", "the network timed (gpt: a language model, on random byte sequences)",
                        choices=MODELS)
    model_options: ModelOptions = expanded(MODEL_OPTIONS.items, ModelOptions, lambda held, family: held[family],
                                           group="model options: {}")  # each sized model's, --MODEL-OPTION
    image_size: int = option(32, "synthetic input side", check=checks.positive)
    channels: int = option(3, "input channels", check=checks.positive)
    classes: int = option(10, "classifier outputs (random labels)",
                          check=checks.at_least(2, "classes to tell apart"))
    batch_size: int = option(64, "global minibatch", check=checks.positive)
    modes: tuple[str, ...] = option(("none", "ddp", "ddp-fp16", "ddp-powersgd", "scalesgd-fp32-ring-size:1",
                                     "scalesgd-fp16-ring-size:1"), MODES_HELP, parse=words, check=checks.distinct)
    warmup: int = option(12, "untimed iterations per mode first, counted after the mode's own warm start "
                         "(PowerSGD's plain-allreduce iterations)", check=checks.at_least(0))
    iterations: int = option(30, "timed iterations per mode", check=checks.positive)
    rounds: int = option(5, "modes take turns this many times", check=checks.positive)
    bandwidths: tuple[str, ...] = option((), "on the testbed (under `scalesgd testbed run`): link rates to measure "
                                         "at in turn, e.g. 100mbit,300mbit,1gbit; rank 0 reshapes the running "
                                         "testbed between them and restores its rate at the end", parse=words,
                                         shown_default="the link as it is",
                                         check=lambda rates: checks.distinct(rates) if rates else None)

    def validate(self) -> TrainBenchConfig:
        """Every option, then every mode as the training run it describes."""
        super().validate()
        self.check_launch(self.workers)
        per_rank = -(-self.batch_size // self.workers)
        if self.text:  # inputs and targets
            self.check_memory(self.workers, "batch_size", BATCHES * per_rank * self.sequence_length * 8 * 2,
                              f"{BATCHES} synthetic batches of {per_rank} × {self.sequence_length} int64 tokens "
                              "and as many targets", "use a smaller `batch_size` or `gpt_block`")
        else:
            self.check_memory(self.workers, "batch_size",
                              BATCHES * per_rank * self.channels * self.image_size ** 2 * 4,
                              f"{BATCHES} synthetic batches of {per_rank} × {self.channels}×{self.image_size}×"
                              f"{self.image_size} float32", "use a smaller `batch_size`, `image_size` or `channels`")
        describe(Mode("ddp", "ddp"), self, self.workers).validate()  # the model, data and batch every mode shares
        for rate in self.bandwidths:
            if not RATE.match(rate):
                raise UsageError(f"`bandwidths` {rate!r}: use tc rates such as 100mbit,300mbit,1gbit")
        if self.bandwidths and not os.environ.get(testbed.PREFIX_VARIABLE):
            raise UsageError("`bandwidths` reshape the testbed: run under "
                             "`scalesgd testbed run -- scalesgd bench train …`")
        for text in self.modes:
            try:
                mode = parse_mode(text)
                if mode.engine != "none":
                    describe(mode, self, self.workers).validate()
                if mode.schedule and self.iterations % mode.schedule.local_steps:
                    raise UsageError(f"`iterations` {self.iterations} must be a multiple of its H, "
                                     f"{mode.schedule.local_steps}: the mean over whole rounds is its step's cost")
            except (ValueError, UsageError) as err:
                raise UsageError(f"`modes` {text}: {err}") from None
        return self

    @property
    def text(self) -> bool:
        """Whether the model timed is a language model, reading token sequences."""
        return MODELS[self.model].data == TEXT

    @property
    def sequence_length(self) -> int:
        """Tokens per sequence of a language model: its context (the training run's, `TrainConfig.data_request`)."""
        return self.model_options["gpt"].block


def describe(mode: Mode, bench: TrainBenchConfig, world: int) -> TrainConfig:
    """The training run a mode stands for: the bench's model (with its size options) and synthetic batches, or a
    language model's text, and this exchange."""
    auto = mode.engine == "auto"
    sized = {flat.name for flat in flat_options(TrainBenchConfig) if flat.prefix in MODEL_OPTIONS}  # gpt_layers, …
    sizes = {name: value for name, value in flatten(bench).items() if name in sized}
    data = {"dataset": "text"} if bench.text else {"dataset": "synthetic", "image_size": bench.image_size,
                                                   "classes": bench.classes}
    chosen = {} if auto else dict(engine=mode.engine, codec=mode.codec,  # auto chooses them
                                  buckets="size:1" if mode.planner != NO_PLANNER else mode.buckets)
    if mode.engine == "periodic":  # workers alone between rounds: the codec carries the pseudo-gradient
        chosen = dict(codec=mode.codec, **mode.schedule.options())
    return TrainConfig.from_dict(dict(
        workers=world, **data, samples=BATCHES * bench.batch_size, **sizes,
        model=bench.model, batch_size=bench.batch_size, base_batch=bench.batch_size, **chosen,
        exchange="auto" if auto else "manual", auto_codecs=mode.auto_codecs or AUTO_CODECS, algorithm=mode.algorithm,
        **mode.codec_options(),
        planner=mode.planner, procs_per_node=bench.procs_per_node, density_warmup=0,
        **({} if mode.engine == "periodic" else {"compress_after": "0"})))  # timed compressed from its first step


@dataclass
class Runner:
    """A mode's own model, optimizer and engine, and what its timed iterations measured."""

    mode: Mode
    exchange: GradientExchange | None  # None: the `none` mode, a bare model and optimizer
    net: nn.Module
    opt: object
    times: list[float]
    compute: list[float]
    stats: list
    planned: dict | None = None
    auto: dict | None = None  # an `auto` mode's decision
    rounds: list[int] = field(default_factory=list)  # the round of each timed iteration
    cpu: list[float] = field(default_factory=list)  # CPU seconds this process used (all its threads)
    loss: Callable = nn.functional.cross_entropy  # what each iteration back-propagates (`criterion`)

    def clear(self) -> None:
        """Forget what was timed (a new link rate)."""
        for kept in (self.times, self.compute, self.stats, self.rounds, self.cpu):
            kept.clear()


def run(cfg: TrainBenchConfig, command: str) -> int:
    """Measure on this rank (all ranks take part), at each link rate asked for; rank 0 writes the results."""
    modes = [parse_mode(m) for m in cfg.modes]
    hierarchical = any(describe(m, cfg, cfg.workers).needs_topology for m in modes if m.engine != "none")
    env = process_group.init(cfg.timeout, cfg.threads,
                             procs_per_node=cfg.node_size(cfg.workers) if hierarchical else None)
    prefix = os.environ.get(testbed.PREFIX_VARIABLE, "")
    original = testbed_rate(prefix) if cfg.bandwidths and env.is_main else None
    try:
        sweep(cfg, modes, env, prefix, command)
        # the DDP wrappers went with sweep's frame, while the group lives: a wrapper freed after it would join
        # gloo's threads holding the GIL one of them may be waiting for (a hang at exit, 1 run in ~30)
        process_group.finish()
        return 0
    finally:
        if original is not None:
            testbed.shape(prefix, original)
        process_group.close()


def sweep(cfg: TrainBenchConfig, modes: list[Mode], env, prefix: str, command: str) -> None:
    """Every mode timed at each link rate (the testbed reshaped to it first); rank 0 writes the results."""
    per_rank = cfg.batch_size // env.world_size
    batches = [(x.to(env.device), y.to(env.device)) for x, y in synthetic_batches(cfg, per_rank, env.rank)]
    layers = layer_profile(cfg, env, batches[0])  # what `scalesgd simulate` needs of the compute
    runners = [build_runner(cfg, mode, env, batches) for mode in modes]
    for runner in runners:  # past each mode's own warm start once, whatever the rate
        for i in range(runner.mode.warm_start):
            iteration(runner, *batches[i % BATCHES], record=False)
    results, links = [], []
    node_size = cfg.node_size(env.world_size)
    for rate in cfg.bandwidths or (None,):
        if rate is not None:
            dist.barrier()
            if env.is_main:
                testbed.shape(prefix, rate)
            dist.barrier()
        measured = link.measure_topology(env.world_size, node_size)
        links.append({"bandwidth": rate} | {k: v.to_dict() if v else None for k, v in measured.items()})
        for i, runner in enumerate(runners):
            if runner.mode.engine == "auto" and rate is not None:  # decide again on this link
                runner.exchange.close()
                runners[i] = build_runner(cfg, runner.mode, env, batches)
        measure(cfg, runners, batches)
        results += [{**summarize(cfg, runner, env), "bandwidth": rate} for runner in runners]
    if env.is_main:
        train_report.write(Path(cfg.out), f"{cfg.model}, {env.world_size} workers, global batch "
                           f"{cfg.batch_size}", cfg.bandwidths,
                           {"world_size": env.world_size, "config": cfg.to_dict(), "results": results,
                            "topology": {"nodes": env.world_size // node_size, "procs_per_node": node_size},
                            "links": links, "layers": layers}, command)
    for runner in runners:
        if runner.exchange is not None:
            runner.exchange.close()


def synthetic_batches(cfg: TrainBenchConfig, per_rank: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's `BATCHES` batches: random images and labels, or random byte sequences of the model's context
    and their next tokens (each sequence one longer, cut into input and target)."""
    g = torch.Generator().manual_seed(1000 + rank)
    # a few different batches in turn: with one batch repeated, a sparsifier's residuals grow
    # along the same direction every step, which no real training does
    if cfg.text:
        tokens = [torch.randint(0, VOCAB_SIZE, (per_rank, cfg.sequence_length + 1), generator=g)
                  for _ in range(BATCHES)]
        return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]
    return [(torch.randn(per_rank, cfg.channels, cfg.image_size, cfg.image_size, generator=g),
             torch.randint(0, cfg.classes, (per_rank,), generator=g))
            for _ in range(BATCHES)]


def criterion(cfg: TrainBenchConfig, world: int) -> Callable:
    """The loss every iteration, profile, plan and `auto` decision back-propagates: an image batch's mean
    cross-entropy, or as the training loop has it a token batch's summed cross-entropy over every next token,
    scaled to the global batch's mean per token."""
    if not cfg.text:
        return nn.functional.cross_entropy
    objective = Objective(True, 0.0, cfg.sequence_length)
    tokens = cfg.batch_size // world * world * cfg.sequence_length  # every rank's share: the global batch's tokens
    return lambda logits, y: global_batch_loss(objective.loss(logits, y), world, tokens)


def bench_model(cfg: TrainBenchConfig, env) -> nn.Module:
    """The same initial model for every mode and the profile: Goyal et al.'s initialisation for a CNN; a GPT
    initialises itself (as in training)."""
    torch.manual_seed(0)
    if cfg.text:
        return build_model(cfg.model, VOCAB_SIZE, 0, cfg.model_options).to(env.device)
    return initialize(build_model(cfg.model, cfg.classes, cfg.channels)).to(env.device)


def layer_profile(cfg: TrainBenchConfig, env, batch) -> dict:
    """Forward and per-tensor backward times of the slowest rank, all ranks computing at once (collective)."""
    return profile.layer_profile(bench_model(cfg, env), batch, criterion(cfg, env.world_size))


def testbed_rate(prefix: str) -> str:
    """The running testbed's link rate, to put back after a sweep."""
    spec = testbed.read_state(prefix)
    if spec is None:
        raise testbed.TestbedError(f"no testbed {prefix!r} is up")
    return spec.bandwidth


def measure(cfg: TrainBenchConfig, runners: list[Runner], batches) -> None:
    """`warmup` untimed iterations per mode, then the modes take turns for `rounds` rounds."""
    for runner in runners:
        runner.clear()
        for i in range(cfg.warmup):
            iteration(runner, *batches[i % BATCHES], record=False)
    per_round = max(1, cfg.iterations // cfg.rounds)
    for r in range(cfg.rounds):
        for runner in runners:
            dist.barrier()
            for i in range(per_round):
                iteration(runner, *batches[i % BATCHES], record=True)
                runner.rounds.append(r)


def build_runner(cfg: TrainBenchConfig, mode: Mode, env, batches: list) -> Runner:
    """The same initial model for every mode, wrapped as the mode says (planned first if it asks)."""
    model = bench_model(cfg, env)
    optimizer = build_sgd(model, 0.01, 0.9, False, 1e-4)
    loss = criterion(cfg, env.world_size)
    if mode.engine == "none":
        return Runner(mode, None, model, optimizer, [], [], [], loss=loss)
    train_cfg = describe(mode, cfg, env.world_size)
    group = own_group() if train_cfg.exchange.own_group else None  # each mode exchanges in a group of its own
    env_for_mode = replace(env, members=replace(env.members, exchange_group=group))
    plan, planned, auto = None, None, None
    if mode.engine == "auto":  # decided on the link as it is now: rebuilt at each rate
        train_cfg, plan, auto = auto_exchange.choose(train_cfg, model, batches, loss, env_for_mode, None, False,
                                                     quiet=True)
    elif mode.planner != NO_PLANNER:
        topk = train_cfg.exchange.codec_options["topk"]
        plan, planned = planner.plan_exchange(train_cfg.exchange.planner, topk.density, topk.reuse,
                                              model, batches[0], loss, group, wire=topk.wire)
    exchange = open_exchange(train_cfg, model, optimizer, train_cfg.exchange_setup(group, env.topology_groups,
                                                                                   plan=plan))
    return Runner(mode, exchange, exchange.model, exchange.optimizer, [], [], [], planned, auto, loss=loss)


def iteration(runner: Runner, x: torch.Tensor, y: torch.Tensor, record: bool) -> None:
    """Forward, backward, exchange and step, timed on this rank."""
    start, cpu = time.perf_counter(), time.process_time()
    runner.loss(runner.net(x), y).backward()
    backward_end = time.perf_counter()
    if runner.exchange is not None:
        runner.exchange.step()  # the mode's own step (a periodic one's synchronisation where a round ends)
    else:
        runner.opt.step()
    runner.opt.zero_grad(set_to_none=True)
    end = time.perf_counter()
    stats = runner.exchange.stats() if runner.exchange is not None else None
    if record:
        runner.times.append(end - start)
        runner.compute.append(backward_end - start)
        runner.cpu.append(time.process_time() - cpu)
        if stats is not None:
            runner.stats.append(stats)


def summarize(cfg: TrainBenchConfig, runner: Runner, env) -> dict:
    """Median over iterations of the slowest rank's time, and per round; the breakdown as this mode measured it."""
    slowest = torch.tensor(runner.times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    median = statistics.median(slowest.tolist())
    per_round: dict[int, list[float]] = {}
    for r, t in zip(runner.rounds, slowest.tolist()):
        per_round.setdefault(r, []).append(t)
    if runner.mode.engine == "periodic":  # most steps exchange nothing: a round's mean is the step's cost
        median = statistics.fmean(slowest.tolist())
    row = {"mode": runner.mode.name, "median_iteration_s": median, "images_per_s": cfg.batch_size / median,
           **({"tokens_per_s": cfg.batch_size * cfg.sequence_length / median} if cfg.text else {}),
           "round_medians_s": [statistics.median(times) for times in per_round.values()],
           "mean_compute_s": statistics.fmean(runner.compute), "mean_cpu_s": statistics.fmean(runner.cpu),
           "iterations": len(runner.times),
           "untimed_iterations": runner.mode.warm_start + cfg.warmup}  # before the first rate
    if runner.stats:
        for key in ("codec_s", "comm_s", "exposed_s", "overlapped_s", "bytes_sent", "thread_cpu_s"):
            row[f"mean_{key}"] = statistics.fmean(getattr(s, key) for s in runner.stats)
    if runner.auto:
        row.update(auto_choice=f"{runner.auto['codec']} {runner.auto['buckets'] or runner.auto['mode']}",
                   predicted_s=runner.auto["predicted_s"], auto=runner.auto)
    if runner.planned:  # the timing model's forward + backward + exchange, against what happened
        done = torch.tensor([c + s.exposed_s for c, s in zip(runner.compute, runner.stats)], dtype=torch.float64)
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        row.update(planned_groups=runner.planned["groups"], predicted_s=runner.planned["predicted_iteration_s"],
                   measured_exchange_end_s=statistics.median(done.tolist()), planned=runner.planned)
    elif runner.mode.engine == "ddp" and _torch_cast(runner.mode.codec):
        grad_bytes = sum(p.numel() for p in runner.net.parameters()) * CODECS[runner.mode.codec].wire_bytes
        row["mean_bytes_sent"] = 2 * (env.world_size - 1) / env.world_size * grad_bytes  # gloo ring estimate
    return row


def _torch_cast(codec: str) -> bool:
    """Whether DDP exchanges `codec` with its own dense allreduce or cast hook, whose bytes no hook of ours counts."""
    entry = CODECS[codec]
    return entry.torch_hook is not None and entry.wire_bytes is not None
