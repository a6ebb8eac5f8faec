"""The one list of codecs and of their option families: the command line's choices, flags and help, validation,
`bench` mode names and the engines' wiring all read them.

Adding a codec is its module plus one `CODECS.add(name, CodecEntry(…))`; a codec with options of its own
registers them once as a family, `CODEC_OPTIONS.add(family, OptionsClass)`: a dataclass of `option(…)` fields,
each with its help, default and check, which the command line offers as `--FAMILY-FIELD`. A codec outside this
package registers the same way from a module named by an entry point in the group `scalesgd.codecs` (its
distribution's `entry_points.txt`: `[scalesgd.codecs]` then `NAME = module`), loaded the first time a registry
is read: every process of a run, the launcher's workers included, then knows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scalesgd.comm.codecs.base import Codec
from scalesgd.options import Flat, build, check_fields, expanded, flat_options, flatten
from scalesgd.registry import OptionFamilies, Registry

PLUGINS = "scalesgd.codecs"  # the entry-point group of codecs registered from outside the package

CODEC_OPTIONS: Registry[type] = Registry("codec option family", plugins=PLUGINS)


class CodecOptions(OptionFamilies):
    """One options object per registered codec family, its family's defaults where none was given."""

    registry = CODEC_OPTIONS


@dataclass(frozen=True, init=False)
class CodecSettings:
    """What a codec is built with: each family's options (its defaults where not given) and what the run knows that
    codecs need: the random seed of their sampling, the steps per epoch (None where not known, as for a library
    user: epoch-based schedules are then off; a DDP hook assumes `step_defaults`' epoch), the optimizer's
    momentum (DGC's momentum correction moves it into the exchange), and the steps between exchanges (periodic
    synchronisation's H; 1: every step), which decides whether a codec's kernels are worth compiling.

        CodecSettings(TopkOptions(density=0.01), Fp8Options(headroom=64), seed=1)
    """

    options: CodecOptions
    seed: int = 0
    steps_per_epoch: int | None = None
    momentum: float = 0.0
    nesterov: bool = False
    momentum_average: bool = False  # the momentum is Adam's: an average of the gradients, not their sum
    local_steps: int = 1

    def __init__(self, *options, seed: int = 0, steps_per_epoch: int | None = None, momentum: float = 0.0,
                 nesterov: bool = False, momentum_average: bool = False, local_steps: int = 1):
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
            raise ValueError(f"local_steps {local_steps!r}: give the steps between exchanges, at least 1")
        held = options[0] if len(options) == 1 and isinstance(options[0], CodecOptions) else CodecOptions.of(*options)
        for name, value in (("options", held), ("seed", seed), ("steps_per_epoch", steps_per_epoch),
                            ("momentum", momentum), ("nesterov", nesterov), ("momentum_average", momentum_average),
                            ("local_steps", local_steps)):
            object.__setattr__(self, name, value)

    def but(self, **changes) -> CodecSettings:
        """These settings with `changes` (by field name)."""
        fields = {name: getattr(self, name) for name in ("seed", "steps_per_epoch", "momentum", "nesterov",
                                                          "momentum_average", "local_steps")}
        return CodecSettings(self.options, **{**fields, **changes})


@dataclass(frozen=True)
class DenseCost:
    """A wire of `element_bytes` bytes a gradient, summed as an allreduce (or, `needs_topology`, in two stages)."""

    element_bytes: float


@dataclass(frozen=True)
class SparseCost:
    """About ⌈density·n⌉ (index, value) pairs from every rank, gathered, each travelling as `entry_wire` says
    (`comm.wire.compact.SPARSE_WIRES`)."""

    density: float
    entry_wire: str
    entry_bytes: float = 0.0  # bytes an entry costs on the wire (0: the wire's table, `sim.network.SPARSE_ENTRY_BYTES`)


@dataclass(frozen=True)
class LowRankCost:
    """Each matrix as rank-`rank` factors where that is `min_rate` times smaller, summed in `sums` allreduces one
    after another (1: one factor a step, in turn), `element_bytes` bytes a number."""

    sums: int
    rank: int
    min_rate: float
    element_bytes: float


Cost = DenseCost | SparseCost | LowRankCost


WHOLE_GRADIENT_ENGINES = ("ddp", "scalesgd")
# Where every codec of ours that sums bucket by bucket runs: the sharded engine's reduce-scatter (each unit's
# gradients one bucket, laid out as FSDP lays them) and, where it shards within each node, its cross-node sum (each
# unit's shard one bucket: every node holds the same shards)
SHARDED_ENGINE = "scalesgd-fsdp"
CROSS_NODE_SHARDS = "scalesgd-fsdp:node"
SHARDED_TOO = (*WHOLE_GRADIENT_ENGINES, SHARDED_ENGINE, "fsdp2")  # FSDP2 as it comes (fsdp2) takes only what says so


@dataclass(frozen=True)
class CodecEntry:
    """A codec's registration: how to build it, and every fact about it that code outside its package needs — the
    engines, the validation, `bench` mode names, the simulator and `--exchange auto` read these, never the name."""

    help: str
    build: Callable[[CodecSettings], Codec] | None  # None: only a PyTorch hook under DDP stands for it
    family: str | None = None  # the option family it is built with (its options checked before it is built)
    engines: tuple[str, ...] | None = None  # the engines that take it (None: every one exchanging whole gradients)
    # in the sharded engine's reduce-scatter, its sum ends in each rank's shard (a ring reduce-scatter); else it
    # sums the whole of each unit's gradients and each rank keeps its shard (1-bit Adam: its momentum is whole)
    scatters: bool = False
    cast: torch.dtype | None = None  # a cast of each element to this dtype, summed as a plain reduce-scatter in it
    reads_weights: bool = False  # it encodes relative to the bucket's parameters' values (`BucketView.params`)
    flag_bytes: int = 0  # bytes of flags each rank allreduces beside a sum that ends in the shards (fp8's int32 flags)
    # under DDP, PyTorch's own, given whether the model is on CUDA and the run's settings (a `DdpHook`; None: its
    # allreduce)
    torch_hook: Callable[[bool, "CodecSettings"], object] | None = None
    torch_hook_needs_cuda: bool = False  # PyTorch's hook runs only on CUDA with NCCL (its bf16 hook)
    needs_topology: bool = False  # its sum runs in the node and cross-node groups (the engines build them for it)
    buckets: str | None = None  # the bucket plan it implies (None: --buckets or the planner decides)
    sparse: bool = False  # sends (index, value) pairs: float32 residuals and sums
    warm_start: int = 0  # plain (uncompressed) iterations it starts with of its own (PowerSGD's start_powerSGD_iter)
    # how `scalesgd simulate` costs one exchange under the run's codec options (None: it has no cost model)
    cost: Callable[[CodecOptions], Cost] | None = None
    amount: str | None = None  # the option a mode's @AMOUNT sets, by flat name (a density, a rank)
    wire_option: str | None = None  # the option a mode's /WIRE sets, by flat name (how entries or factors travel)
    optimizer: str | None = None  # the optimizer it works with and that needs it (1-bit Adam's exchange and update)
    beta1_option: str | None = None  # a codec option, by flat name, that must equal the optimizer's β1
    dense_start: bool = False  # it needs dense (fp32) steps before it compresses (1-bit Adam freezes Adam's variance)
    cost_proxy: str | None = None  # the codec of ours whose measured costs stand for this one's (a PyTorch hook's)
    keeps_gradients: bool = False  # its codec carries gradients across steps (residuals, a momentum): per worker
    # a rank may join its exchange mid-run: its state splits into what every rank shares (a joiner heals with it)
    # and each rank's own residuals (a joiner's start at zero; a dead rank's go with it)
    joinable: bool = True
    # the periodic `scalesgd train` options (by flat name) it runs at unless given, where it carries pseudo-gradients
    # (`local_steps`): SparseLoCo's error feedback stands in for the outer momentum, so its outer step is averaging
    recipe: dict = field(default_factory=dict)
    planned_as_topk: bool = False  # the layer-merging planner's profile (top-k's threshold, density and wire) is its

    def runs_on(self, engine: str) -> bool:
        """Whether `engine` (or `CROSS_NODE_SHARDS`) takes it."""
        if engine in (SHARDED_ENGINE, CROSS_NODE_SHARDS):  # ours, on buckets as they come (no grouping of its own)
            return self.build is not None and self.buckets is None
        return engine in (self.engines or WHOLE_GRADIENT_ENGINES)

    @property
    def simulated(self) -> bool:
        """Whether `scalesgd simulate` has a cost model for it."""
        return self.cost is not None

    @property
    def wire_bytes(self) -> float | None:
        """A dense codec's bytes a gradient on the wire; None for the others."""
        cost = self.cost(CodecOptions()) if self.cost is not None else None
        return cost.element_bytes if isinstance(cost, DenseCost) else None

    @property
    def plannable(self) -> bool:
        """Whether the planner may merge layers into this codec's groups: its timing model is the top-k family's
        (`planned_as_topk`: sparse over all ranks at `--density` on `--topk-wire`), with no bucket rule of its own."""
        return self.planned_as_topk and self.sparse and self.buckets is None and not self.needs_topology


CODECS: Registry[CodecEntry] = Registry("codec", plugins=PLUGINS)


def make_codec(name: str, settings: CodecSettings | None = None) -> Codec:
    """A fresh instance of the registered codec `name` (codecs may hold per-run state), its family's options checked
    first (UsageError naming the option: `fp8_headroom` 0.5: must be >= 1)."""
    entry = CODECS[name]
    if entry.build is None:
        raise ValueError(f"codec {name!r} has no scalesgd implementation: under DDP it is PyTorch's own hook")
    settings = settings or CodecSettings()
    if entry.family is not None:
        check_fields(settings.options[entry.family], prefix=entry.family)
    return entry.build(settings)


def entry_of(codec: Codec) -> CodecEntry | None:
    """The registration of a codec instance (by its name); None for one that is not registered."""
    return CODECS[codec.name] if codec.name in CODECS else None


def needs_topology(codec: Codec) -> bool:
    """Whether the engines must build the node and cross-node groups for this codec instance."""
    entry = entry_of(codec)
    return entry is not None and entry.needs_topology


@dataclass
class _AllFamilies:
    """Every family's options as one config, so flat names (`density`, `fp8_headroom`) build and check them."""

    options: CodecOptions = expanded(CODEC_OPTIONS.items, CodecOptions, lambda held, family: held[family])


def options_from_flat(values: dict) -> CodecOptions:
    """Codec options from values by flat name (`density`, `lowrank_min_rate`), the others at their defaults, each
    family's checks run (UsageError naming the option by its flat name)."""
    held = build(_AllFamilies, values)
    check_fields(held)
    return held.options


def flat_codec_options(options: CodecOptions) -> dict:
    """Codec options by flat name: what `options_from_flat` reads back."""
    return flatten(_AllFamilies(options))


def codec_option(name: str) -> Flat:
    """A codec option by its flat name (KeyError where none has it)."""
    return {flat.name: flat for flat in flat_options(_AllFamilies)}[name]


# ---- the schedule a codec starts with, in steps ------------------------------------------------------------------
# `scalesgd train` exchanges every lossy codec dense (fp32) until the end of its LR warmup (`--compress-after warmup`,
# `--warmup-epochs 5`: the 5-epoch gradual warmup of Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training
# ImageNet in 1 Hour"), then ramps top-k's density over `--density-warmup 4` epochs (Lin et al. 2018, "Deep Gradient
# Compression"). A codec built where the epoch length is known gets exactly these, in steps; one built where it is not
# (a DDP hook that was not told) takes an "epoch" of ASSUMED_EPOCH_STEPS steps: what one epoch is in the large-batch
# runs scalesgd is for (ImageNet's 1.28 M images at a global batch of 6.4k; Goyal et al.'s 8k gives 156 steps,
# CIFAR-10 at 256 gives 195). That makes the dense start 1,000 steps, the default `start_powerSGD_iter` of PyTorch's
# PowerSGD hook, and the density ramp 800 steps.
ASSUMED_EPOCH_STEPS = 200
DENSE_START_EPOCHS = 5.0  # = `scalesgd train`'s default --warmup-epochs, which --compress-after warmup follows


@dataclass(frozen=True)
class StepDefaults:
    """The default schedule around a codec, in steps: the epoch its density warm-up counts in, and the steps each
    parameter is exchanged dense (fp32) before the codec takes over."""

    steps_per_epoch: int
    dense_steps: int


def step_defaults(steps_per_epoch: int | None = None) -> StepDefaults:
    """`scalesgd train`'s default dense start and epoch for a run of `steps_per_epoch` steps an epoch; where that is
    not known (None or 0), for an epoch of ASSUMED_EPOCH_STEPS steps."""
    if steps_per_epoch is not None and steps_per_epoch < 0:
        raise ValueError(f"steps_per_epoch {steps_per_epoch}: give the steps of an epoch, or None for the assumed "
                         f"{ASSUMED_EPOCH_STEPS}")
    epoch = steps_per_epoch or ASSUMED_EPOCH_STEPS
    return StepDefaults(epoch, round(DENSE_START_EPOCHS * epoch))


def with_steps_per_epoch(settings: CodecSettings, steps_per_epoch: int | None) -> CodecSettings:
    """`settings` for a run of `steps_per_epoch` steps an epoch (the same object where it says so already)."""
    if settings.steps_per_epoch == steps_per_epoch:
        return settings
    return settings.but(steps_per_epoch=steps_per_epoch)
