"""One dataclass per command, validated once before any worker starts."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path

from scalesgd.comm.buckets import parse_spec
from scalesgd.errors import UsageError
from scalesgd.recipe.scaling import SCALING_RULES, scaled_lr
from scalesgd.recipe.schedule import SCHEDULES, WARMUPS, default_milestones

MODEL_CHOICES = ("resnet8", "resnet20", "resnet56", "resnet50", "vgg16")
DATASET_CHOICES = ("digits", "synthetic", "cifar10")
ENGINE_CHOICES = ("ddp", "scalesgd")
ALGORITHM_CHOICES = ("ring", "halving_doubling", "hierarchical", "native")
FP8_CODECS = ("fp8", "fp8-direct", "fp8-flat")
SPARSE_CODECS = ("topk", "topk-global", "lags")
ENGINE_CODECS = {"ddp": ("fp32", "fp16", "bf16", "powersgd", *FP8_CODECS),
                 "scalesgd": ("fp32", "fp16", "bf16", *FP8_CODECS, *SPARSE_CODECS)}
PLANNER_CHOICES = ("none", "dlgs", "optimal")
OPTIMIZER_CHOICES = ("sgd", "lars")
TWO_STAGE_CODECS = ("fp8", "fp8-direct")  # need the node groups, as the hierarchical allreduce does
DIGITS_TRAIN_SIZE = 1437
CIFAR10_TRAIN_SIZE = 50_000
MIN_PER_WORKER = 2  # BatchNorm needs more than one sample per worker

# Options that describe where and how a run executes, not what it computes: a resumed run may change them.
RUNTIME_FIELDS = frozenset({"run_dir", "quiet", "timeout", "master_addr", "master_port", "threads", "trace"})


@dataclass
class TrainConfig:
    """Everything `scalesgd train` needs; the same object is saved as config.json and in checkpoints."""

    workers: int = 2
    dataset: str = "digits"
    data_dir: str | None = None
    samples: int = 5000
    image_size: int = 32
    classes: int = 10
    model: str = "resnet8"
    batch_size: int = 128
    epochs: int = 30
    base_lr: float = 0.1
    base_batch: int = 256
    lr_scaling: str = "linear"
    warmup: str = "gradual"
    warmup_epochs: float = 5.0
    schedule: str = "step"
    milestones: tuple[float, ...] | None = None
    gamma: float = 0.1
    power: float = 2.0
    end_lr: float = 0.0
    arccot_epoch: float | None = None
    arccot_slope: float = 1.0
    optimizer: str = "sgd"
    trust_coefficient: float = 0.001
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4
    bias_decay: bool = True
    zero_gamma: bool = True
    bn_momentum: float = 0.1
    bn_batch: int = 0
    label_smoothing: float = 0.0
    seed: int = 0
    engine: str = "ddp"
    codec: str = "fp32"
    algorithm: str = "ring"
    buckets: str = "size:1"
    procs_per_node: int = 0
    fp8_eps: float = 1e-5
    fp8_quantile: float = 0.95
    fp8_period: int = 100
    fp8_samples: int = 1024
    density: float = 0.1
    topk_reuse: int = 10
    planner: str = "none"
    trace: str = ""
    run_dir: str = ""
    timeout: float = 300.0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    threads: int = 0
    quiet: bool = False

    @property
    def per_worker_batch(self) -> int:
        return self.batch_size // self.workers

    @property
    def needs_topology(self) -> bool:
        """Whether workers build the node / cross-node groups (hierarchical allreduce, two-stage fp8)."""
        return self.algorithm == "hierarchical" and self.engine == "scalesgd" or self.codec in TWO_STAGE_CODECS

    @property
    def effective_buckets(self) -> str:
        """The plan spec the engine uses: global Top-K is one bucket, LAGS one per layer."""
        from scalesgd.comm.codecs import SPARSE_PLANS

        return SPARSE_PLANS.get(self.codec) or self.buckets

    @property
    def own_exchange_group(self) -> bool:
        """Whether the exchange runs in a process group of its own (our engine, or our DDP hook)."""
        return self.engine == "scalesgd" or self.codec in FP8_CODECS

    def fp8_options(self):
        from scalesgd.comm.codecs.fp8 import Fp8Options

        return Fp8Options(self.fp8_eps, self.fp8_quantile, self.fp8_period, self.fp8_samples)

    @property
    def resolved_milestones(self) -> tuple[float, ...]:
        return tuple(self.milestones) if self.milestones is not None else default_milestones(self.epochs)

    @property
    def peak_lr(self) -> float:
        """The rate after scaling for the global batch: the target of warmup."""
        return scaled_lr(self.base_lr, self.batch_size, self.base_batch, self.lr_scaling)

    @property
    def resolved_arccot_epoch(self) -> float:
        """The arccot schedule's midpoint (rate halved there): half of training unless given."""
        return self.arccot_epoch if self.arccot_epoch is not None else self.epochs / 2

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["milestones"] = list(self.milestones) if self.milestones is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"unknown configuration keys {unknown}; this version accepts {sorted(known)}")
        d = dict(d)
        if d.get("milestones") is not None:
            d["milestones"] = tuple(float(m) for m in d["milestones"])
        return cls(**d)

    def validate(self) -> "TrainConfig":
        """Raise UsageError naming the first bad value and what is accepted."""
        _choice("--model", self.model, MODEL_CHOICES)
        _choice("--dataset", self.dataset, DATASET_CHOICES)
        _choice("--lr-scaling", self.lr_scaling, SCALING_RULES)
        _choice("--warmup", self.warmup, WARMUPS)
        _choice("--schedule", self.schedule, SCHEDULES)
        _choice("--optimizer", self.optimizer, OPTIMIZER_CHOICES)
        _choice("--engine", self.engine, ENGINE_CHOICES)
        _choice(f"--codec (with --engine {self.engine})", self.codec, ENGINE_CODECS[self.engine])
        _choice("--algorithm", self.algorithm, ALGORITHM_CHOICES)
        try:
            parse_spec(self.buckets)
        except ValueError as err:
            raise UsageError(f"--buckets: {err}") from None
        _choice("--planner", self.planner, PLANNER_CHOICES)
        if self.planner != "none" and self.codec != "topk":
            raise UsageError(f"--planner {self.planner} plans the groups of --codec topk (with --engine scalesgd); "
                             f"got --codec {self.codec}")
        if not 0 < self.density <= 1:
            raise UsageError(f"--density {self.density}: must be in (0, 1]")
        if self.topk_reuse < 1:
            raise UsageError(f"--topk-reuse {self.topk_reuse}: must be >= 1 (1 recomputes the threshold every step)")
        for problem in self.fp8_options().problems():
            raise UsageError(f"--{problem.replace(' ', '-', 1)}")
        if self.procs_per_node < 0:
            raise UsageError(f"--procs-per-node {self.procs_per_node}: must be >= 0 (0 reads LOCAL_WORLD_SIZE)")
        if self.procs_per_node and self.workers % self.procs_per_node:
            raise UsageError(f"--procs-per-node {self.procs_per_node} does not divide --workers {self.workers}")
        for name, value in (("--workers", self.workers), ("--batch-size", self.batch_size),
                            ("--epochs", self.epochs), ("--base-batch", self.base_batch),
                            ("--samples", self.samples), ("--image-size", self.image_size),
                            ("--classes", self.classes)):
            _positive(name, value)
        for name, value in (("--base-lr", self.base_lr), ("--timeout", self.timeout),
                            ("--power", self.power), ("--arccot-slope", self.arccot_slope),
                            ("--trust-coefficient", self.trust_coefficient)):
            _positive(name, value)
        if not 0 < self.gamma <= 1:
            raise UsageError(f"--gamma {self.gamma}: must be in (0, 1] (the step schedule's factor)")
        if not 0 < self.bn_momentum <= 1:
            raise UsageError(f"--bn-momentum {self.bn_momentum}: must be in (0, 1] (torch's convention, "
                             f"the weight of the new batch's statistics)")
        if self.bn_batch and (self.bn_batch < MIN_PER_WORKER or self.per_worker_batch % self.bn_batch):
            raise UsageError(f"--bn-batch {self.bn_batch}: must divide the {self.per_worker_batch} samples per worker "
                             f"and be at least {MIN_PER_WORKER} (0: BN over each worker's whole batch)")
        if self.arccot_epoch is not None and not 0 <= self.arccot_epoch <= self.epochs:
            raise UsageError(f"--arccot-epoch {self.arccot_epoch}: must be in 0..{self.epochs} (--epochs)")
        if not 0 <= self.end_lr < self.peak_lr:
            raise UsageError(f"--end-lr {self.end_lr}: must be >= 0 and below the scaled rate {self.peak_lr:g}")
        if self.nesterov and self.momentum == 0:
            raise UsageError("--nesterov needs --momentum above 0")
        if self.classes < 2:
            raise UsageError(f"--classes {self.classes}: need at least 2 classes")
        if not 0 <= self.momentum < 1:
            raise UsageError(f"--momentum {self.momentum}: must be in [0, 1)")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise UsageError(f"--weight-decay {self.weight_decay}: must be a finite number >= 0")
        if not 0 <= self.label_smoothing < 1:
            raise UsageError(f"--label-smoothing {self.label_smoothing}: must be in [0, 1)")
        if self.threads < 0:
            raise UsageError(f"--threads {self.threads}: must be >= 0 (0 picks cores / local workers)")
        if not 0 <= self.master_port <= 65535:
            raise UsageError(f"--master-port {self.master_port}: must be in 0..65535 (0 picks a free port)")
        if self.batch_size % self.workers:
            raise UsageError(f"--batch-size {self.batch_size} does not divide evenly by --workers "
                             f"{self.workers}; use a multiple of {self.workers}")
        if self.per_worker_batch < MIN_PER_WORKER:
            raise UsageError(f"--batch-size {self.batch_size} gives {self.per_worker_batch} sample(s) per "
                             f"worker; BatchNorm needs at least {MIN_PER_WORKER} per worker")
        if self.warmup != "none":
            if not (0 <= self.warmup_epochs <= self.epochs):
                raise UsageError(f"--warmup-epochs {self.warmup_epochs} is longer than training "
                                 f"(--epochs {self.epochs}); use 0..{self.epochs} or --warmup none")
        milestones = self.resolved_milestones
        if any(not 0 < m <= self.epochs for m in milestones) or list(milestones) != sorted(milestones):
            raise UsageError(f"--milestones {','.join(f'{m:g}' for m in milestones)}: must be increasing "
                             f"epochs in (0, {self.epochs}]")
        if self.dataset == "cifar10":
            self._check_data_dir()
        train_size = self.train_size()
        if self.batch_size > train_size:
            raise UsageError(f"--batch-size {self.batch_size} is larger than the {self.dataset} training "
                             f"set ({train_size} samples)")
        return self

    def train_size(self) -> int:
        """Training-set size, known without loading the data."""
        return {"digits": DIGITS_TRAIN_SIZE, "cifar10": CIFAR10_TRAIN_SIZE}.get(self.dataset, self.samples)

    def _check_data_dir(self) -> None:
        if not self.data_dir:
            raise UsageError("--dataset cifar10 needs --data-dir: the folder holding cifar-10-batches-py")
        from scalesgd.data.cifar10 import check_cifar10_dir  # imported late: validation stays cheap
        from scalesgd.data.dataset import DataError

        try:
            check_cifar10_dir(self.data_dir)
        except DataError as err:
            raise UsageError(str(err)) from None

    def incompatible_with(self, stored: "TrainConfig") -> list[str]:
        """Names of the options that differ from a stored run's and would change what it computes."""
        return [f.name for f in fields(self)
                if f.name not in RUNTIME_FIELDS and getattr(self, f.name) != getattr(stored, f.name)]


def option_name(field_name: str) -> str:
    """The command-line spelling of a config field."""
    return "--" + field_name.replace("_", "-")


def _choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"{option} {value!r} is not known; choose from {', '.join(choices)}")


def _positive(option: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"{option} {value}: must be a positive number")


def default_run_dir() -> Path:
    """runs/<timestamp>, unique even when two runs start in the same second."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path("runs") / stamp
    n = 1
    while path.exists():
        n += 1
        path = Path("runs") / f"{stamp}-{n}"
    return path


DTYPE_CHOICES = ("float32", "float16", "bfloat16", "float64")
BENCH_EXCHANGES = (*ALGORITHM_CHOICES, "fp16", "fp8", "fp8-flat")  # algorithms, then compressed exchanges


class _Record:
    """A config written into JSON records: tuples become lists."""

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


@dataclass
class BenchLaunch(_Record):
    """Where a benchmark's workers run and where rank 0 writes; shared by every `scalesgd bench` command."""

    procs_per_node: int = 0
    out: str = ""
    timeout: float = 300.0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    threads: int = 0

    def _validate_launch(self, workers: int, warmup: int) -> None:
        _positive("--workers", workers)
        _positive("--timeout", self.timeout)
        if warmup < 0:
            raise UsageError(f"--warmup {warmup}: must be >= 0")
        if self.procs_per_node < 0 or (self.procs_per_node and workers % self.procs_per_node):
            raise UsageError(f"--procs-per-node {self.procs_per_node}: must divide --workers {workers}")



@dataclass
class AllreduceBenchConfig(BenchLaunch):
    """`scalesgd bench allreduce`: sizes in elements, every algorithm timed on the same tensors."""

    workers: int = 4
    sizes: tuple[int, ...] = (256, 4096, 16384, 65536, 262144, 1 << 20, 1 << 22)
    algorithms: tuple[str, ...] = ("ring", "halving_doubling", "native")
    repeats: int = 10
    warmup: int = 3
    dtype: str = "float32"

    def validate(self) -> "AllreduceBenchConfig":
        self._validate_launch(self.workers, self.warmup)
        _positive("--repeats", self.repeats)
        if not self.sizes or any(n < 0 for n in self.sizes):
            raise UsageError(f"--sizes {','.join(map(str, self.sizes))}: give element counts >= 0")
        if not self.algorithms:
            raise UsageError("--algorithms: give at least one")
        for algorithm in self.algorithms:
            _choice("--algorithms", algorithm, BENCH_EXCHANGES)
        _choice("--dtype", self.dtype, DTYPE_CHOICES)
        compressed = sorted(set(self.algorithms) - set(ALGORITHM_CHOICES))
        if compressed and self.dtype != "float32":
            raise UsageError(f"--algorithms {','.join(compressed)} compress float32 gradients; use --dtype float32")
        return self


@dataclass
class TrainBenchConfig(BenchLaunch):
    """`scalesgd bench train`: every exchange mode timed on the same model, data and workers."""

    workers: int = 2
    model: str = "resnet20"
    image_size: int = 32
    channels: int = 3
    classes: int = 10
    batch_size: int = 64
    modes: tuple[str, ...] = ("none", "ddp", "ddp-fp16", "ddp-powersgd", "scalesgd-fp32-ring-size:1",
                              "scalesgd-fp16-ring-size:1")
    warmup: int = 12
    iterations: int = 30
    rounds: int = 5

    def validate(self) -> "TrainBenchConfig":
        from scalesgd.bench.train import parse_mode

        self._validate_launch(self.workers, self.warmup)
        for name in ("image_size", "channels", "batch_size", "iterations", "rounds"):
            _positive(option_name(name), getattr(self, name))
        _choice("--model", self.model, MODEL_CHOICES)
        if self.classes < 2:
            raise UsageError(f"--classes {self.classes}: need at least 2 classes")
        if self.batch_size % self.workers or self.batch_size // self.workers < MIN_PER_WORKER:
            raise UsageError(f"--batch-size {self.batch_size}: must be a multiple of --workers {self.workers} "
                             f"with at least {MIN_PER_WORKER} per worker")
        if not self.modes:
            raise UsageError("--modes: give at least one")
        for text in self.modes:
            try:
                mode = parse_mode(text)
            except ValueError as err:
                raise UsageError(f"--modes: {err}") from None
            if mode.engine != "none":
                _choice(f"--modes {text}: codec", mode.codec, ENGINE_CODECS[mode.engine])
            if mode.engine == "scalesgd":
                _choice(f"--modes {text}: algorithm", mode.algorithm, ALGORITHM_CHOICES)
                if mode.planner != "none":
                    _choice(f"--modes {text}: planner", mode.planner, PLANNER_CHOICES[1:])
                    if mode.codec != "topk":
                        raise UsageError(f"--modes {text}: a planner plans the groups of the topk codec")
                else:
                    try:
                        parse_spec(mode.buckets)
                    except ValueError as err:
                        raise UsageError(f"--modes {text}: {err}") from None
                if not 0 < mode.density <= 1:
                    raise UsageError(f"--modes {text}: density must be in (0, 1]")
        return self


@dataclass
class LinkBenchConfig(BenchLaunch):
    """`scalesgd bench link`: throughput and round trip across the link between two nodes."""

    workers: int = 2
    megabytes: int = 16
    repeats: int = 5
    warmup: int = 0

    def validate(self) -> "LinkBenchConfig":
        self._validate_launch(self.workers, self.warmup)
        _positive("--megabytes", self.megabytes)
        _positive("--repeats", self.repeats)
        if self.workers < 2:
            raise UsageError(f"--workers {self.workers}: a link needs at least 2")
        return self


@dataclass
class CodecBenchConfig(_Record):
    """`scalesgd bench codec`: the fp8 kernels' throughput on one process, each path on the same data."""

    sizes: tuple[int, ...] = (1 << 20, 1 << 24)
    paths: tuple[str, ...] = ("compiled", "eager")
    repeats: int = 5
    warmup: int = 2
    threads: int = 1
    out: str = ""

    def validate(self) -> "CodecBenchConfig":
        _positive("--repeats", self.repeats)
        _positive("--threads", self.threads)
        if self.warmup < 0:
            raise UsageError(f"--warmup {self.warmup}: must be >= 0")
        if not self.sizes or any(n < 1 for n in self.sizes):
            raise UsageError(f"--sizes {','.join(map(str, self.sizes))}: give element counts >= 1")
        if not self.paths or len(set(self.paths)) != len(self.paths):
            raise UsageError(f"--paths {','.join(self.paths)}: give compiled and/or eager, each once")
        for path in self.paths:
            _choice("--paths", path, ("compiled", "eager"))
        return self



@dataclass
class AccuracyBenchConfig(_Record):
    """`scalesgd bench accuracy`: `scalesgd train` with shared options, per variant and seed."""

    variants: tuple[str, ...] = ("--codec fp32",)
    seeds: tuple[int, ...] = (0, 1, 2)
    train_args: tuple[str, ...] = ()
    out: str = ""

    def validate(self) -> "AccuracyBenchConfig":
        import shlex

        from scalesgd.cli import train_config

        if not self.variants:
            raise UsageError("--variants: give at least one, e.g. '--codec fp32;--codec fp8'")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise UsageError(f"--seeds {','.join(map(str, self.seeds))}: give distinct seeds")
        for variant in self.variants:
            try:
                argv = [*self.train_args, *shlex.split(variant)]
            except ValueError as err:
                raise UsageError(f"--variants {variant!r}: {err}") from None
            forbidden = {"--seed", "--run-dir", "--resume"} & set(argv)
            if forbidden:
                raise UsageError(f"{', '.join(sorted(forbidden))} in {variant!r}: the bench sets it per run")
            train_config(argv)
        return self


SWEEP_SETS = ("--batch-size", "--lr-scaling", "--warmup", "--seed", "--run-dir", "--resume")


@dataclass
class SweepConfig(_Record):
    """`scalesgd sweep`: final error against global minibatch for each scaling rule and warmup (SPEC §1)."""

    batches: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    rules: tuple[str, ...] = ("linear",)
    warmups: tuple[str, ...] = ("gradual",)
    optimizers: tuple[str, ...] = ()  # empty: the train options decide
    schedules: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0,)
    train_args: tuple[str, ...] = ()
    out: str = ""

    def validate(self) -> "SweepConfig":
        from scalesgd.cli import train_config
        from scalesgd.train.sweep import grid

        for option, values, choices in (("--rules", self.rules, SCALING_RULES), ("--warmups", self.warmups, WARMUPS),
                                        ("--optimizers", self.optimizers, OPTIMIZER_CHOICES),
                                        ("--schedules", self.schedules, SCHEDULES)):
            if len(set(values)) != len(values):
                raise UsageError(f"{option} {','.join(values)}: give each value once")
            for value in values:
                _choice(option, value, choices)
        for option, values in (("--rules", self.rules), ("--warmups", self.warmups), ("--batches", self.batches),
                               ("--seeds", self.seeds)):
            if not values:
                raise UsageError(f"{option}: give at least one")
        if len(set(self.batches)) != len(self.batches) or any(b < 1 for b in self.batches):
            raise UsageError(f"--batches {','.join(map(str, self.batches))}: give distinct sizes >= 1")
        if len(set(self.seeds)) != len(self.seeds):
            raise UsageError(f"--seeds {','.join(map(str, self.seeds))}: give distinct seeds")
        owned = set(SWEEP_SETS) | ({"--optimizer"} if self.optimizers else set()) | (
            {"--schedule"} if self.schedules else set())
        given = sorted(owned & set(self.train_args))
        if given:
            raise UsageError(f"{', '.join(given)} after --: the sweep sets it for each run")
        for point in grid(self):
            try:
                train_config(point.argv(self.train_args))
            except UsageError as err:
                raise UsageError(f"{point.label}: {err}") from None
        return self


BENCH_OPTIMIZERS = ("sgd", "sgd-foreach", "lars", "naive-lars")  # sgd is torch's default (per-tensor on CPU)


@dataclass
class OptimizerBenchConfig(_Record):
    """`scalesgd bench optimizer`: one step() of each optimizer on one model's parameters, against torch's SGD."""

    model: str = "resnet50"
    optimizers: tuple[str, ...] = ("sgd", "lars", "naive-lars")
    repeats: int = 20
    warmup: int = 3
    threads: int = 1
    weight_decay: float = 5e-5
    out: str = ""

    def validate(self) -> "OptimizerBenchConfig":
        _choice("--model", self.model, MODEL_CHOICES)
        _positive("--repeats", self.repeats)
        _positive("--threads", self.threads)
        if self.warmup < 0:
            raise UsageError(f"--warmup {self.warmup}: must be >= 0")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise UsageError(f"--weight-decay {self.weight_decay}: must be a finite number >= 0")
        if not self.optimizers or len(set(self.optimizers)) != len(self.optimizers):
            raise UsageError(f"--optimizers {','.join(self.optimizers)}: give each optimizer once")
        for name in self.optimizers:
            _choice("--optimizers", name, BENCH_OPTIMIZERS)
        if "sgd" not in self.optimizers:
            raise UsageError(f"--optimizers {','.join(self.optimizers)}: include sgd, the reference of the ratios")
        return self
