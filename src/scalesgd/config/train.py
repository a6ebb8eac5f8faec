"""`scalesgd train`'s configuration: one object of namespaces — data, model, recipe, exchange, runtime, output —
each option declared once in its namespace beside its help and accepted values, validated once here.

The command line is generated from the fields (`scalesgd.options`) with flat names (`--batch-size`, `batch_size`),
the same object is saved as config.json under those names (so a run directory of any version resumes), and every
bad-input error of a training run comes from `validate`, naming options in backticks (the CLI shows them as
--flags).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from scalesgd import checks
from scalesgd.comm.codecs import CODECS, CodecSettings
from scalesgd.comm.config import ExchangeConfig
from scalesgd.comm.engine.exchange import RENAMED, ExchangeSetup, engine_named
from scalesgd.config import rules
from scalesgd.config.output import OutputConfig
from scalesgd.config.runtime import RuntimeConfig
from scalesgd.data import DATASETS, DataRequest
from scalesgd.data.config import DataConfig
from scalesgd.errors import UsageError
from scalesgd.models import MODELS
from scalesgd.models.config import ModelConfig
from scalesgd.optim import OPTIMIZERS, variance_horizon
from scalesgd.options import (build, check_fields, field_default, flat_options, flatten, nested, parse, refuse,
                              runtime_fields)
from scalesgd.periodic.config import PeriodicConfig
from scalesgd.recipe.config import RecipeConfig
from scalesgd.recipe.defaults import brought
from scalesgd.trace import Tracer

# options a resumed run may change (with a warning: it is no longer exact); --epochs only to more, --workers
# with the same global batch (the sampler cuts the same global batches; codec state is averaged over the old ranks)
RESUME_MAY_CHANGE = ("base_lr", "epochs", "workers")
LISTS = ("auto_codecs", "betas")  # options of words or numbers that config.json holds as lists (and milestones)


@dataclass
class TrainConfig:
    """Everything `scalesgd train` needs, by namespace; the same object is saved as config.json and in checkpoints."""

    data: DataConfig = nested(DataConfig, "data")
    model: ModelConfig = nested(ModelConfig, "model")
    recipe: RecipeConfig = nested(RecipeConfig, "recipe")
    exchange: ExchangeConfig = nested(ExchangeConfig, "exchange")
    periodic: PeriodicConfig = nested(PeriodicConfig, "periodic synchronisation")
    runtime: RuntimeConfig = nested(RuntimeConfig, "runtime")
    output: OutputConfig = nested(OutputConfig, "output")

    # ---- what the options imply together --------------------------------------------------------
    @property
    def per_worker_batch(self) -> int:
        """Samples each worker contributes to a step (over all its micro-batches)."""
        return self.recipe.batch_size // self.runtime.workers

    @property
    def micro_batch(self) -> int:
        """Samples of one forward and backward on one worker."""
        return self.per_worker_batch // self.recipe.accumulate

    def data_request(self) -> DataRequest:
        """What the run asks of its dataset."""
        return self.data.request(self.model.sequence_length, self.recipe.seed)

    def train_size(self) -> int:
        """Training-set size, known without loading the data."""
        return DATASETS[self.data.dataset].train_size(self.data_request())

    @property
    def replica_scope(self) -> str:
        """What one periodic-synchronisation replica is: a process, or a node (asked for, or a model sharded within
        each node)."""
        return "node" if self.periodic.on and (self.periodic.replica == "node" or self.exchange.hybrid) else "process"

    @property
    def needs_topology(self) -> bool:
        """Whether workers build the node and cross-node groups: the exchange's, or replicas of a node each."""
        return self.exchange.needs_topology or self.replica_scope == "node"

    @property
    def measures_noise(self) -> bool:
        """Whether the run counts the gradient norms the noise scale needs (asked for, or AdaScale's gain)."""
        return self.output.noise_scale or self.recipe.lr_scaling == "adascale"

    @property
    def other_optimizer(self) -> str:
        """The optimizer where it is not the model's own, else "": its steps to a target are measured apart."""
        own = MODELS[self.model.name].recipe.get("optimizer", field_default(RecipeConfig, "optimizer"))
        return self.recipe.optimizer if self.recipe.optimizer != own else ""

    @property
    def freezes_variance(self) -> bool:
        """Whether Adam's variance is frozen where compression starts (1-bit Adam, `freeze_variance`, Adam's momentum
        in the exchange)."""
        r = self.recipe
        return OPTIMIZERS[r.optimizer].freezes_variance or r.optimizer == "adamw" and (
            r.freeze_variance or self.exchange.momentum_in_exchange)

    def compress_after_steps(self, steps_per_epoch: int) -> int:
        """The dense steps before compression, from STEPS, EPOCHSep or warmup: the end of the rate's warmup, and where
        Adam's variance is frozen there, no earlier than its averaging horizon 1/(1 − β2)."""
        steps = self.exchange.compress_after_steps(steps_per_epoch, self.recipe.warmup_steps(steps_per_epoch))
        if self.exchange.compress_after == "warmup" and self.freezes_variance:
            return max(steps, variance_horizon(self.recipe.betas[1]))
        return steps

    def codec_settings(self, steps_per_epoch: int = 1) -> CodecSettings:
        """What this run's codecs are built with: each family's options and the run's seed, epoch, momentum and
        steps between exchanges."""
        r = self.recipe
        adam = r.optimizer == "adamw"  # Adam's momentum, where an exchange carries it
        return self.exchange.codec_settings(r.seed, steps_per_epoch, r.betas[0] if adam else r.momentum, r.nesterov,
                                            adam, self.periodic.local_steps if self.periodic.on else 1)

    def build_optimizer(self, model: nn.Module, steps_per_epoch: int = 1):
        """The recipe's optimizer for `model` (the loop's, and auto's trial copies'), for epochs of `steps_per_epoch`
        steps: the momentum left to the exchange where DGC's correction carries it."""
        return self.recipe.build_optimizer(
            model, momentum_in_exchange=self.exchange.momentum_in_exchange,
            freeze_step=self.compress_after_steps(steps_per_epoch))

    def exchange_setup(self, group=None, topology=None, tracer: Tracer | None = None, plan=None,
                       steps_per_epoch: int = 1, norms=None) -> ExchangeSetup:
        """How this run's gradients travel, in the given groups (`plan`: the planner's buckets; `norms`: where
        the squared gradient norms are counted). Under periodic synchronisation a codec's step is a round: its
        epoch-long schedules (top-k's density warm-up) count rounds, and it compresses from the first."""
        if self.periodic.on:
            rounds = self.periodic.schedule.rounds_in(steps_per_epoch)
            setup = self.exchange.setup(self.codec_settings(rounds), 0, self.recipe.precision, group, topology,
                                        tracer, plan, norms)
        else:
            setup = self.exchange.setup(self.codec_settings(steps_per_epoch),
                                        self.compress_after_steps(steps_per_epoch), self.recipe.precision, group,
                                        topology, tracer, plan, norms)
        return replace(setup, clip_norm=self.recipe.clip_norm)

    # ---- saving and resuming ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Every option by its flat name (a codec family's as `fp8_headroom`), lists for tuples: config.json."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in flatten(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """The config `to_dict` wrote, or the options the command line gave (by flat name), the rest at what the
        chosen model and optimizer bring (`scalesgd.recipe.defaults`), else at their defaults."""
        known = {flat.name for flat in flat_options(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"unknown configuration keys {unknown}; this version accepts {sorted(known)}")
        d = {**brought(d, field_default(ModelConfig, "name"), field_default(RecipeConfig, "optimizer"), CODECS), **d}
        if d.get("engine") in RENAMED:  # a run directory of an earlier version, or its name typed (warned of there)
            d["engine"] = engine_named(d["engine"], warn=False)
        if d.get("milestones") is not None:
            d["milestones"] = tuple(float(m) for m in d["milestones"])
        for key in LISTS:
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        return build(cls, d)

    @classmethod
    def of(cls, **options) -> TrainConfig:
        """A config with these options, by flat name (`batch_size`, `codec`, `fp8_headroom`), the rest at their
        defaults; not validated."""
        return cls.from_dict(options)

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

    def inexact_changes(self, stored: TrainConfig) -> list[str]:
        """Of the options a resumed run may change (`RESUME_MAY_CHANGE`), those that differ from the stored run's:
        the run continues, but no longer as the uninterrupted one would have."""
        mine, theirs = flatten(self), flatten(stored)
        return [name for name in RESUME_MAY_CHANGE if mine[name] != theirs[name]]

    # ---- validation ------------------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        """Raise UsageError naming the first bad value (as `field`) and what is accepted: each option's own check,
        then the rules between options (`scalesgd.config.rules`)."""
        check_fields(self)
        refuse("master_port", self.runtime.master_port,
               checks.master_port(self.runtime.master_addr, self.runtime.master_port))
        for rule in (rules.exchange, rules.batch, rules.schedule, rules.data):
            rule(self)
        return self
