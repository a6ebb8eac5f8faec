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
from dataclasses import dataclass

from scalesgd.comm.codecs.base import Codec
from scalesgd.options import check_fields
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
    user: epoch-based schedules are then off; a DDP hook assumes `step_defaults`' epoch), and the optimizer's
    momentum (DGC's momentum correction moves it into the exchange).

        CodecSettings(TopkOptions(density=0.01), Fp8Options(headroom=64), seed=1)
    """

    options: CodecOptions
    seed: int = 0
    steps_per_epoch: int | None = None
    momentum: float = 0.0
    nesterov: bool = False
    momentum_average: bool = False  # the momentum is Adam's: an average of the gradients, not their sum

    def __init__(self, *options, seed: int = 0, steps_per_epoch: int | None = None, momentum: float = 0.0,
                 nesterov: bool = False, momentum_average: bool = False):
        held = options[0] if len(options) == 1 and isinstance(options[0], CodecOptions) else CodecOptions.of(*options)
        for name, value in (("options", held), ("seed", seed), ("steps_per_epoch", steps_per_epoch),
                            ("momentum", momentum), ("nesterov", nesterov), ("momentum_average", momentum_average)):
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class CodecEntry:
    """A codec's registration: how to build it, and what the engines and the validation must know of it."""

    help: str
    build: Callable[[CodecSettings], Codec] | None  # None: only a PyTorch hook under DDP stands for it
    family: str | None = None  # the option family it is built with (its options checked before it is built)
    engines: tuple[str, ...] | None = None  # the engines that take it (None: every one)
    # under DDP, PyTorch's own, given whether the model is on CUDA and the run's settings (a `DdpHook`; None: its
    # allreduce)
    torch_hook: Callable[[bool, "CodecSettings"], object] | None = None
    torch_hook_needs_cuda: bool = False  # PyTorch's hook runs only on CUDA with NCCL (its bf16 hook)
    needs_topology: bool = False  # its sum runs in the node and cross-node groups
    buckets: str | None = None  # the bucket plan it implies (None: --buckets or the planner decides)
    sparse: bool = False  # sends (index, value) pairs
    warm_start: int = 0  # plain (uncompressed) iterations it starts with of its own (PowerSGD's start_powerSGD_iter)
    wire_bytes: float | None = None  # a dense codec's bytes per element on the wire (what the simulator costs)
    # a low-rank codec's sums per bucket, one after another (0: not low-rank; 1: one factor a step, in turn), which
    # the simulator costs by each tensor's shape
    factor_sums: int = 0

    def runs_on(self, engine: str) -> bool:
        return self.engines is None or engine in self.engines

    @property
    def simulated(self) -> bool:
        """Whether `scalesgd simulate` has a cost model for it: a dense codec of known width, a sparse or a low-rank
        one."""
        return self.wire_bytes is not None or self.sparse or self.factor_sums > 0

    @property
    def plannable(self) -> bool:
        """Whether the planner may merge layers into this codec's groups: sparse over all ranks (its timing model),
        with no bucket rule of its own."""
        return self.sparse and self.buckets is None and not self.needs_topology


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
    return CodecSettings(settings.options, seed=settings.seed, steps_per_epoch=steps_per_epoch,
                         momentum=settings.momentum, nesterov=settings.nesterov,
                         momentum_average=settings.momentum_average)
