"""`scalesgd train`'s configuration: each option declared once, beside its help and accepted values, validated once.

The command line is generated from these fields (`scalesgd.options`), the same object is saved as
config.json and in checkpoints, and every bad-input error of a training run comes from `validate`,
naming fields in backticks (the CLI shows them as --flags).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from scalesgd import checks
from scalesgd.comm.codecs import CODEC_OPTIONS, CODECS, CodecEntry, CodecOptions, CodecSettings
from scalesgd.comm.cost.planner import PLANNERS
from scalesgd.comm.engine.buckets import spec_problem
from scalesgd.comm.engine.exchange import ENGINES, ExchangeSetup, exchange_names, parse_exchange
from scalesgd.comm.wire.collectives import ALGORITHMS
from scalesgd.config import rules
from scalesgd.config.rules import NO_PLANNER
from scalesgd.data import DATASETS, DataRequest
from scalesgd.errors import UsageError
from scalesgd.models import MODEL_OPTIONS, MODELS, ModelOptions
from scalesgd.optim import OPTIMIZERS
from scalesgd.options import (
    build,
    check_fields,
    expanded,
    flat_options,
    flatten,
    floats_of,
    option,
    parse,
    refuse,
    runtime_fields,
    words,
)
from scalesgd.recipe.adascale import AdaScaleFactor
from scalesgd.recipe.params import build_optimizer
from scalesgd.recipe.scaling import SCALING_RULES, scaled_lr
from scalesgd.recipe.schedule import SCHEDULES, WARMUPS, LrFactor, default_milestones
from scalesgd.trace import Tracer

EXCHANGES = ("manual", "auto")
PRECISIONS = ("fp32", "bf16", "fp16")  # forward and backward under autocast to this type (fp32: none)
AUGMENTS = ("standard", "none")
# what --exchange auto weighs unless told: the exchanges that keep fp32's accuracy, ours and PyTorch's DDP's (ddp-bf16
# where CUDA runs it). The low-rank and sparse ones change what is learned (PyTorch's PowerSGD hook: +6.9 % validation
# loss on the language model under AdamW, top-k ρ 0.01 +8.3 %, docs/results.md#language-model), so auto weighs them
# only when listed: `--auto-codecs fp32,fp8,lowrank-acp,ddp,ddp-powersgd`.
AUTO_CODECS = ("fp32", "fp16", "bf16", "fp8", "ddp", "ddp-fp16", "ddp-bf16")

WORKERS, DATA, RECIPE, OUTPUT = "workers", "data and model", "large-minibatch recipe", "output"


def _cuda_only(exchange: str) -> bool:
    """Whether an exchange is PyTorch's hook that runs only on CUDA with NCCL (DDP's bf16)."""
    engine, codec = parse_exchange(exchange)
    return engine == "ddp" and CODECS[codec].torch_hook_needs_cuda


def _steps_or_epochs(text: str) -> str | None:
    """What is wrong with a --compress-after value (STEPS, EPOCHSep or warmup), or None."""
    try:
        value = float(text[:-2]) if text.endswith("ep") else int(text) if text != "warmup" else 0
    except ValueError:
        return "give STEPS, EPOCHSep (e.g. 2ep) or warmup"
    return None if value >= 0 and math.isfinite(value) else "must be >= 0 and finite"


class LrSchedule(NamedTuple):
    """The rate the schedule multiplies (scaled for the global batch) and its factor at every step."""

    peak: float
    factor: LrFactor


# options a resumed run may change (with a warning: it is no longer exact); --epochs only to more, --workers
# with the same global batch (the sampler cuts the same global batches; codec state is averaged over the old ranks)
RESUME_MAY_CHANGE = ("base_lr", "epochs", "workers")
EVERY = re.compile(r"^(\d+(?:\.\d+)?)(min)?$")  # --checkpoint-every: steps, or minutes
MAX_EVERY = 1e9  # steps or minutes: more is never

@dataclass
class TrainConfig:
    """Everything `scalesgd train` needs; the same object is saved as config.json and in checkpoints."""

    workers: int = option(2, "local worker processes; under torchrun the launch decides", group=WORKERS,
                          check=checks.local_workers)
    dataset: str = option("digits", "the data trained and tested on", choices=DATASETS, group=DATA)
    data_dir: str | None = option(None, "folder holding the dataset's files (cifar10: cifar-10-batches-py; "
                                  "imagefolder: train/<class>/* and val/<class>/*, JPEG or PNG)", parse=str,
                                  group=DATA)
    data_file: str | None = option(None, "text: a file of your own to train on, read as bytes", parse=str,
                                   group=DATA, shown_default="the Python standard library's own sources")
    samples: int = option(5000, "synthetic: training samples; text: training sequences at most", group=DATA,
                          check=checks.positive)
    image_size: int | None = option(None, "image side: synthetic images are made at it, imagefolder's are cropped "
                                    "to it", parse=int, group=DATA, shown_default="synthetic 32, imagefolder 224",
                                    check=lambda v: None if v is None else checks.positive(v))
    augment: str = option("standard", "standard: the dataset's training augmentation (cifar10: pad-4 crop and flip; "
                          "imagefolder: random-resized crop, area 8–100 %, aspect ¾–4/3, and flip, evaluated at a "
                          "256/224 resize and centre crop); none: the images as they are (imagefolder: resized to "
                          "--image-size and centre-cropped, for training and evaluation)", choices=AUGMENTS,
                          group=DATA)
    skip_bad_images: bool = option(False, "imagefolder: leave out a file that is empty, truncated or no image, "
                                   "saying its path once and counting it in summary.json (default: stop, naming it)",
                                   group=DATA)
    loader_workers: int | None = option(None, "imagefolder: processes decoding images for each worker (0: in the "
                                        "worker itself)", parse=int, group=DATA, runtime=True,
                                        shown_default="the cores training leaves free, shared out, at least 1",
                                        check=lambda v: None if v is None else checks.at_least(0)(v))
    classes: int = option(10, "synthetic classes", group=DATA, check=checks.at_least(2, "classes to tell apart"))
    model: str = option("resnet8", "the network trained (gpt: a language model, on text)", choices=MODELS,
                        group=DATA)
    model_options: ModelOptions = expanded(MODEL_OPTIONS.items, ModelOptions, lambda held, family: held[family],
                                           group="model options: {}")  # each sized model's, --MODEL-OPTION
    batch_size: int = option(128, "global minibatch kn: what one step averages over", group=RECIPE,
                             check=checks.positive)
    accumulate: int = option(1, "micro-batches per step: each worker runs its share of --batch-size in N parts, "
                             "summing their gradients, and exchanges once, on the last", group=RECIPE,
                             check=checks.at_least(1))
    precision: str = option("fp32", "forward and backward arithmetic: autocast to bf16, or to fp16 with a gradient "
                            "scaler (a step with an overflow is skipped, by every rank and codec); weights and "
                            "optimizer stay fp32", choices=PRECISIONS, group=RECIPE)
    epochs: int = option(30, "passes over the training set (with --lr-scaling adascale, the base batch's: the run "
                         "goes on until its scale-invariant schedule is done)", group=RECIPE, check=checks.positive)
    base_lr: float = option(0.1, "rate tuned at --base-batch", group=RECIPE, check=checks.positive)
    base_batch: int = option(256, "global minibatch --base-lr was tuned at; --lr-scaling scales the rate by "
                             "--batch-size ÷ this", group=RECIPE, check=checks.positive)
    lr_scaling: str = option("linear", "how the peak rate follows --batch-size ÷ --base-batch: in proportion, "
                             "by its square root, not at all, or adascale: by the gain measured from the gradient "
                             "noise (1 to the ratio; the schedule runs in scale-invariant steps; no warmup; 2+ "
                             "workers)", choices=SCALING_RULES, group=RECIPE)
    warmup: str = option("gradual", "how the rate reaches the scaled peak: gradual rises linearly from --base-lr "
                         "over --warmup-epochs, constant holds --base-lr for them and then jumps, none starts at "
                         "the peak", choices=WARMUPS, group=RECIPE)
    warmup_epochs: float = option(5.0, "epochs of warmup (fractions allowed)", group=RECIPE,
                                  check=checks.finite_non_negative)
    schedule: str = option("step", "decay of the rate after warmup: step (× --gamma at each of --milestones), "
                           "cosine or poly (down to --end-lr), arccot", choices=SCHEDULES, group=RECIPE)
    milestones: tuple[float, ...] | None = option(None, "step-schedule epochs, comma-separated", group=RECIPE,
                                                  parse=floats_of("epochs"), shown_default="30,60,80 of 90 scaled")
    gamma: float = option(0.1, "step schedule: factor at each milestone", group=RECIPE,
                          check=checks.within(0, 1, low_open=True, note="the step schedule's factor"))
    power: float = option(2.0, "poly schedule power", group=RECIPE, check=checks.positive)
    end_lr: float = option(0.0, "cosine / poly: the rate they end at", group=RECIPE)
    arccot_epoch: float | None = option(None, "arccot schedule: epoch e where the rate is half the peak",
                                        parse=float, group=RECIPE, shown_default="half of --epochs")
    arccot_slope: float = option(1.0, "arccot schedule: a in arccot(a·(epoch − e))/π", group=RECIPE,
                                 check=checks.positive)
    optimizer: str = option("sgd", "momentum SGD, LARS's per-layer rate, LAMB (Adam with LARS's per-layer ratio), "
                            "AdamW (torch's; no decay on norms, biases and embeddings), or 1-bit Adam (AdamW "
                            "while --compress-after's steps are dense, then the momentum travels as signs: "
                            "needs --codec onebit)", choices=OPTIMIZERS, group=RECIPE)
    betas: tuple[float, ...] = option((0.9, 0.999), "Adam's β1,β2 (lamb, adamw, onebit-adam)", group=RECIPE,
                                      parse=floats_of("betas"), check=checks.betas)
    freeze_variance: bool = option(False, "adamw: Adam's variance frozen at its value where compression starts "
                                   "(--compress-after), as 1-bit Adam does: an error-fed sparse gradient arrives in "
                                   "rare large spikes, which inflate the variance and shrink Adam's steps",
                                   group=RECIPE)
    trust_coefficient: float = option(0.001, "LARS trust coefficient", group=RECIPE, check=checks.positive)
    momentum: float = option(0.9, "momentum coefficient μ of SGD (and LARS), in [0, 1); lamb ignores it",
                             group=RECIPE, check=checks.within(0, 1, high_open=True))
    nesterov: bool = option(False, "Nesterov momentum (sgd, lars)", group=RECIPE)
    weight_decay: float = option(1e-4, "L2 weight decay (never on BN γ/β)", group=RECIPE,
                                 check=checks.finite_non_negative)
    bias_decay: bool = option(True, "no decay on biases", flag="--no-bias-decay", group=RECIPE)
    zero_gamma: bool = option(True, "γ = 1 on the last BN of residual blocks", flag="--no-zero-gamma",
                              group=RECIPE)
    bn_momentum: float = option(0.1, "weight of each batch in BN's running statistics", group=RECIPE,
                                check=checks.within(0, 1, low_open=True, note="torch's convention, the weight "
                                                    "of the new batch's statistics"))
    bn_batch: int = option(0, "BN statistics over groups of N samples, as N samples per worker would give "
                           "(ghost batch norm); 0: each worker's whole batch", group=RECIPE)
    label_smoothing: float = option(0.0, "cross-entropy label smoothing: weight of the uniform target, in [0, 1)",
                                    group=RECIPE, check=checks.within(0, 1, high_open=True))
    seed: int = option(0, "seeds the initial weights, each epoch's shuffle and the codecs' sampling", group=RECIPE,
                       check=checks.seed)
    engine: str = option("ddp", "gradient exchange", choices=ENGINES, group=WORKERS)
    codec: str = option("fp32", "what travels; with ddp, fp16/bf16/powersgd are PyTorch's own comm hooks, the "
                        "others ours", choices=CODECS, check_choices=False, group=WORKERS)
    algorithm: str = option("ring", "scalesgd engine's allreduce", choices=ALGORITHMS, group=WORKERS)
    buckets: str = option("size:1", "scalesgd engine's bucket plan: size:MB | growing[:FIRST_MB[:FACTOR]] | layer "
                          "| single", group=WORKERS, check=spec_problem)
    procs_per_node: int = option(0, "processes per node for hierarchical exchange", group=WORKERS,
                                 shown_default="LOCAL_WORLD_SIZE",
                                 check=checks.at_least(0, "0 reads LOCAL_WORLD_SIZE"))
    compress_after: str = option("warmup", "a lossy codec compresses after this many dense (fp32) steps: STEPS, "
                                 "EPOCHSep, or warmup (the end of the LR warmup)", group=WORKERS,
                                 check=_steps_or_epochs)
    exchange: str = option("manual", "auto: at start-up measure the compute, the link and each exchange of "
                           "--auto-codecs on this process group, simulate each with every bucket plan, try the closest "
                           "for real, and use the fastest (engine and codec: ours or DDP's); manual: --engine, --codec "
                           "and --buckets as given", choices=EXCHANGES, group=WORKERS)
    auto_codecs: tuple[str, ...] = option(AUTO_CODECS, "the exchanges --exchange auto weighs: our codecs by name, "
                                          "ddp (DDP's fp32 allreduce) and ddp-CODEC (DDP with PyTorch's fp16, bf16 or "
                                          "PowerSGD hook, or ours); low-rank and sparse ones only when listed; "
                                          "ddp-bf16 is left out without CUDA", parse=words, group=WORKERS,
                                          choices=exchange_names,
                                          check=checks.distinct)
    codec_options: CodecOptions = expanded(CODEC_OPTIONS.items, CodecOptions, lambda held, family: held[family],
                                           group="codec options: {}")  # each family's, --FAMILY-OPTION
    planner: str = option(NO_PLANNER, "sparse codecs: merge layers into groups from a measured timing model, "
                          "greedily (dlgs) or exactly (optimal); none: --buckets decides",
                          choices=lambda: (NO_PLANNER, *PLANNERS), group=WORKERS)
    trace: str = option("", "write a Chrome trace (open in Perfetto) of the last epoch to this file",
                        group=WORKERS, runtime=True, check=checks.output_file)
    run_dir: str = option("", "where results go", shown_default="runs/<timestamp>", group=OUTPUT, runtime=True,
                          check=checks.output_dir)
    checkpoint_every: str = option("0", "also checkpoint mid-epoch, every N steps or every Nmin minutes, so a kill "
                                   "loses at most that (each epoch's end always checkpoints); 0: epochs only",
                                   group=OUTPUT, runtime=True, check=lambda v: None if EVERY.match(v) and
                                   float(EVERY.match(v)[1]) <= MAX_EVERY else
                                   f"use 0, a number of steps (200) or minutes (10min), at most {MAX_EVERY:.0e}")
    timeout: float = option(300.0, "seconds any collective may wait", group=WORKERS, runtime=True,
                            check=checks.timeout)
    max_restarts: int = option(0, "a failed worker group (a worker lost, not bad input or divergence) starts again "
                               "from the last checkpoint, this many times at most; under torchrun give torchrun's "
                               "own --max-restarts and a --run-dir", group=WORKERS, runtime=True,
                               check=checks.at_least(0))
    master_addr: str = option("127.0.0.1", "rendezvous address", group=WORKERS, runtime=True,
                              check=checks.master_addr)
    master_port: int = option(0, "rendezvous port", shown_default="a free one", group=WORKERS, runtime=True,
                              check=checks.within(0, 65535, note="0 picks a free port"))
    threads: int = option(0, "compute threads per worker", shown_default="cores / workers", group=WORKERS,
                          runtime=True, check=checks.threads(0, "0 picks cores / local workers"))
    quiet: bool = option(False, "print nothing while training", group=OUTPUT, runtime=True)
    sync_every: int = option(10, "iterations between reads of the loss on the host (one allreduce of their "
                             "losses, no per-step wait); a non-finite loss stops the run at the next read",
                             group=OUTPUT, runtime=True, check=checks.at_least(1))
    noise_scale: bool = option(False, "measure the gradient noise scale B_simple (McCandlish et al.): the batch "
                               "beyond which larger batches stop paying, from each worker's gradient and the "
                               "exchanged mean, in samples, per epoch in metrics.jsonl, summary.json and report.png "
                               "(needs 2+ workers)", group=OUTPUT, runtime=True)

    # ---- what the options imply ------------------------------------------------------------------
    @property
    def per_worker_batch(self) -> int:
        """Samples each worker contributes to a step (over all its micro-batches)."""
        return self.batch_size // self.workers

    @property
    def micro_batch(self) -> int:
        """Samples of one forward and backward on one worker."""
        return self.per_worker_batch // self.accumulate

    @property
    def text(self) -> bool:
        """Whether the run trains a language model on token sequences."""
        return DATASETS[self.dataset].text

    def data_request(self) -> DataRequest:
        """What the run asks of its dataset."""
        return DataRequest(data_dir=self.data_dir, data_file=self.data_file, samples=self.samples,
                           image_size=self.side, num_classes=self.classes,
                           sequence_length=self.model_options["gpt"].block, augment=self.augment != "none",
                           skip_bad_images=self.skip_bad_images, seed=self.seed)

    @property
    def side(self) -> int:
        """The image side: --image-size, else the dataset's own default."""
        return self.image_size or DATASETS[self.dataset].image_size

    @property
    def codec_entry(self) -> CodecEntry:
        return CODECS[self.codec]

    @property
    def needs_topology(self) -> bool:
        """Whether workers build the node / cross-node groups (hierarchical allreduce, two-stage fp8, and any codec
        --exchange auto may choose)."""
        codecs = [parse_exchange(c)[1] for c in self.auto_candidates] if self.exchange == "auto" else (self.codec,)
        return (ALGORITHMS[self.algorithm].needs_topology and self.engine == "scalesgd"
                or any(CODECS[c].needs_topology for c in codecs))

    @property
    def auto_candidates(self) -> tuple[str, ...]:
        """The exchanges --exchange auto weighs here: --auto-codecs, less PyTorch's CUDA-only hooks without CUDA
        when the list is the default one (a list given names only what runs, `rules.exchange`)."""
        if self.auto_codecs != AUTO_CODECS or torch.cuda.is_available():
            return self.auto_codecs
        return tuple(c for c in self.auto_codecs if not _cuda_only(c))

    @property
    def own_exchange_group(self) -> bool:
        """Whether the exchange runs in a process group of its own, created at start-up."""
        return self.exchange == "auto" or ENGINES[self.engine].uses_own_group(self.codec_entry)

    def compress_after_steps(self, steps_per_epoch: int) -> int:
        """The dense steps before compression, from STEPS, EPOCHSep or warmup."""
        if self.compress_after == "warmup":
            return 0 if self.warmup == "none" else round(self.warmup_epochs * steps_per_epoch)
        if self.compress_after.endswith("ep"):
            return round(float(self.compress_after[:-2]) * steps_per_epoch)
        return int(self.compress_after)

    def codec_settings(self, steps_per_epoch: int = 1) -> CodecSettings:
        """What this run's codecs are built with: each family's options and the run's seed, epoch and momentum."""
        adam = self.optimizer == "adamw"  # Adam's momentum, where an exchange carries it
        return CodecSettings(self.codec_options, seed=self.seed, steps_per_epoch=steps_per_epoch,
                             momentum=self.betas[0] if adam else self.momentum, nesterov=self.nesterov,
                             momentum_average=adam)

    @property
    def topk(self):
        """The sparse codecs' options (density, reuse, DGC's corrections): what the planner and the optimizer read."""
        return self.codec_options["topk"]

    def build_optimizer(self, model, steps_per_epoch: int = 1):
        """The recipe's optimizer for `model` with this run's settings (the loop's, and auto's trial copies'), for
        epochs of `steps_per_epoch` steps."""
        return build_optimizer(model, self.optimizer, self.peak_lr, self.momentum, self.nesterov,
                               self.weight_decay, self.bias_decay, self.trust_coefficient,
                               momentum_in_exchange=self.topk.momentum_correction, betas=self.betas,
                               freeze_step=self.compress_after_steps(steps_per_epoch),
                               freeze_variance=self.freeze_variance)

    def exchange_setup(self, group=None, topology=None, tracer: Tracer | None = None, plan=None,
                       steps_per_epoch: int = 1, norms=None) -> ExchangeSetup:
        """How this run's gradients travel, in the given groups (`plan`: the planner's buckets; `norms`: where
        the squared gradient norms are counted)."""
        return ExchangeSetup(self.codec, self.codec_settings(steps_per_epoch),
                             self.compress_after_steps(steps_per_epoch), self.algorithm, plan or self.buckets, group,
                             topology, tracer or Tracer(), norms, self.precision)

    def lr_schedule(self, steps_per_epoch: int = 1) -> LrSchedule:
        """The scaled peak rate and the schedule as a pure function of the step (with adascale, of the
        scale-invariant step): every schedule parameter is derived here, once."""
        peak = scaled_lr(self.base_lr, self.batch_size, self.base_batch, self.lr_scaling)
        if self.lr_scaling != "adascale":
            return LrSchedule(peak, self.lr_factor(peak, steps_per_epoch))
        scale = self.batch_size / self.base_batch  # the base batch's schedule, in its own (S times more) steps
        base = replace(self.lr_factor(peak, round(scale * steps_per_epoch)), warmup="none", warmup_steps=0, start=1.0)
        return LrSchedule(peak, AdaScaleFactor.over(base, scale))

    def lr_factor(self, peak: float, steps_per_epoch: int) -> LrFactor:
        """Warmup and decay as a function of the step, for `steps_per_epoch` steps an epoch."""
        milestones = tuple(self.milestones) if self.milestones is not None else default_milestones(self.epochs)
        return LrFactor(
            total_steps=self.epochs * steps_per_epoch, steps_per_epoch=steps_per_epoch, warmup=self.warmup,
            warmup_steps=round(self.warmup_epochs * steps_per_epoch), start=min(self.base_lr / peak, 1.0),
            schedule=self.schedule, milestones=milestones, gamma=self.gamma, power=self.power, end=self.end_lr / peak,
            arccot_epoch=self.arccot_epoch if self.arccot_epoch is not None else self.epochs / 2,
            arccot_slope=self.arccot_slope)

    @property
    def measures_noise(self) -> bool:
        """Whether the run counts the gradient norms the noise scale needs (asked for, or AdaScale's gain)."""
        return self.noise_scale or self.lr_scaling == "adascale"

    @property
    def peak_lr(self) -> float:
        """The rate after scaling for the global batch: the target of warmup."""
        return self.lr_schedule().peak

    def train_size(self) -> int:
        """Training-set size, known without loading the data."""
        return DATASETS[self.dataset].train_size(self.data_request())

    # ---- saving and resuming ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Every option by its flat name (a codec family's as `fp8_headroom`), lists for tuples: config.json."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in flatten(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """The config `to_dict` wrote, or the options the command line gave (by flat name)."""
        known = {flat.name for flat in flat_options(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"unknown configuration keys {unknown}; this version accepts {sorted(known)}")
        d = dict(d)
        if d.get("milestones") is not None:
            d["milestones"] = tuple(float(m) for m in d["milestones"])
        for key in ("auto_codecs", "betas"):  # lists in JSON
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        return build(cls, d)

    def replaced(self, **options) -> TrainConfig:
        """A copy with these options changed, named as `to_dict` names them (`density`, `fp8_headroom`, …)."""
        return TrainConfig.from_dict({**self.to_dict(), **options})

    @classmethod
    def from_argv(cls, argv: list[str]) -> TrainConfig:
        """The validated configuration that `scalesgd train ARGV` would run (UsageError otherwise)."""
        return cls.from_dict(parse(cls, list(argv), "scalesgd train")).validate()

    def incompatible_with(self, stored: TrainConfig) -> list[str]:
        """Names of the options that differ from a stored run's and that a resumed run cannot take."""
        runtime, mine, theirs = runtime_fields(type(self)), flatten(self), flatten(stored)
        return [name for name in mine if name not in runtime and name not in RESUME_MAY_CHANGE
                and mine[name] != theirs[name]]

    @property
    def checkpoint_interval(self) -> tuple[int, float]:
        """(steps, seconds) between mid-epoch checkpoints; 0 where that kind is off."""
        number, minutes = EVERY.match(self.checkpoint_every).groups()
        return (0, float(number) * 60) if minutes else (int(float(number)), 0.0)

    def inexact_changes(self, stored: TrainConfig) -> list[str]:
        """Of the options a resumed run may change (`RESUME_MAY_CHANGE`), those that differ from the stored run's:
        the run continues, but no longer as the uninterrupted one would have."""
        return [name for name in RESUME_MAY_CHANGE if getattr(self, name) != getattr(stored, name)]

    # ---- validation ------------------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        """Raise UsageError naming the first bad value (as `field`) and what is accepted: each option's own check,
        then the rules between options (`scalesgd.config.rules`)."""
        check_fields(self)
        refuse("master_port", self.master_port, checks.master_port(self.master_addr, self.master_port))
        for rule in (rules.exchange, rules.batch, rules.schedule, rules.data):
            rule(self)
        return self
