"""`scalesgd train`'s recipe options: the global batch and its micro-batches, the arithmetic, the rate and how it
is scaled, warmed up and decayed, the optimizer and its decay, BN's statistics, the random seed; and what they build: the
rate schedule and the optimizer."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import nn

from scalesgd import checks
from scalesgd.optim import OPTIMIZERS
from scalesgd.options import floats_of, option
from scalesgd.recipe.adascale import AdaScaleFactor
from scalesgd.recipe.defaults import shown
from scalesgd.recipe.params import build_optimizer
from scalesgd.recipe.scaling import SCALING_RULES, scaled_lr
from scalesgd.recipe.schedule import SCHEDULES, WARMUPS, LrFactor, default_milestones

PRECISIONS = ("fp32", "bf16", "fp16")  # forward and backward under autocast to this type (fp32: none)


class LrSchedule(NamedTuple):
    """The rate the schedule multiplies (scaled for the global batch) and its factor at every step."""

    peak: float
    factor: LrFactor


@dataclass
class RecipeConfig:
    """The large-minibatch recipe of Goyal et al. 2017 and the optimizers beyond it."""

    batch_size: int = option(128, "global minibatch kn: what one step averages over", check=checks.positive,
                             shown_default=shown("batch_size"))
    accumulate: int = option(1, "micro-batches per step: each worker runs its share of --batch-size in N parts, "
                             "summing their gradients, and exchanges once, on the last", check=checks.at_least(1))
    precision: str = option("fp32", "forward and backward arithmetic: autocast to bf16, or to fp16 with a gradient "
                            "scaler (a step with an overflow is skipped, by every rank and codec); weights and "
                            "optimizer stay fp32", choices=PRECISIONS)
    epochs: int = option(30, "passes over the training set (with --lr-scaling adascale, the base batch's: the run "
                         "goes on until its scale-invariant schedule is done)", check=checks.positive,
                         shown_default=shown("epochs"))
    base_lr: float = option(0.1, "rate tuned at --base-batch", check=checks.positive, shown_default=shown("base_lr"))
    base_batch: int = option(256, "global minibatch --base-lr was tuned at; --lr-scaling scales the rate by "
                             "--batch-size ÷ this", check=checks.positive, shown_default=shown("base_batch"))
    lr_scaling: str = option("linear", "how the peak rate follows --batch-size ÷ --base-batch: in proportion, "
                             "by its square root, not at all, or adascale: by the gain measured from the gradient "
                             "noise (1 to the ratio; the schedule runs in scale-invariant steps; no warmup; 2+ "
                             "workers)", choices=SCALING_RULES, shown_default=shown("lr_scaling"))
    warmup: str = option("gradual", "how the rate reaches the scaled peak: gradual rises linearly from --base-lr "
                         "over --warmup-epochs, constant holds --base-lr for them and then jumps, none starts at "
                         "the peak", choices=WARMUPS)
    warmup_epochs: float = option(5.0, "epochs of warmup (fractions allowed)", check=checks.finite_non_negative,
                                  shown_default=shown("warmup_epochs"))
    schedule: str = option("step", "decay of the rate after warmup: step (× --gamma at each of --milestones), "
                           "cosine or poly (down to --end-lr), arccot", choices=SCHEDULES,
                           shown_default=shown("schedule"))
    milestones: tuple[float, ...] | None = option(None, "step-schedule epochs, comma-separated",
                                                  parse=floats_of("epochs"), shown_default="30,60,80 of 90 scaled")
    gamma: float = option(0.1, "step schedule: factor at each milestone",
                          check=checks.within(0, 1, low_open=True, note="the step schedule's factor"))
    power: float = option(2.0, "poly schedule power", check=checks.positive)
    end_lr: float = option(0.0, "cosine / poly: the rate they end at")
    arccot_epoch: float | None = option(None, "arccot schedule: epoch e where the rate is half the peak",
                                        parse=float, shown_default="half of --epochs")
    arccot_slope: float = option(1.0, "arccot schedule: a in arccot(a·(epoch − e))/π", check=checks.positive)
    optimizer: str = option("sgd", "momentum SGD, LARS's per-layer rate, LAMB (Adam with LARS's per-layer ratio), "
                            "AdamW (torch's; no decay on norms, biases and embeddings), 1-bit Adam (AdamW "
                            "while --compress-after's steps are dense, then the momentum travels as signs: "
                            "needs --codec onebit), or muon (torch's Muon on the hidden weight matrices, its update "
                            "at AdamW's RMS, with AdamW on the embeddings, output head, biases and norms)",
                            choices=OPTIMIZERS, shown_default=shown("optimizer"))
    betas: tuple[float, ...] = option((0.9, 0.999), "Adam's β1,β2 (lamb, adamw, onebit-adam, muon's AdamW part)",
                                      parse=floats_of("decay rates β1,β2, each in [0, 1), e.g. 0.9,0.95"),
                                      check=checks.betas, shown_default=shown("betas"))
    freeze_variance: bool = option(False, "adamw: Adam's variance frozen at its value where compression starts "
                                   "(--compress-after), as 1-bit Adam does: an error-fed sparse gradient arrives in "
                                   "rare large spikes, which inflate the variance and shrink Adam's steps")
    trust_coefficient: float = option(0.001, "LARS trust coefficient", check=checks.positive)
    momentum: float = option(0.9, "momentum coefficient μ of SGD (and LARS), in [0, 1); lamb ignores it, muon "
                             "keeps torch Muon's 0.95",
                             check=checks.within(0, 1, high_open=True))
    nesterov: bool = option(False, "Nesterov momentum (sgd, lars)")
    weight_decay: float = option(1e-4, "L2 weight decay (never on BN γ/β)", check=checks.finite_non_negative,
                                 shown_default=shown("weight_decay"))
    bias_decay: bool = option(True, "no decay on biases", flag="--no-bias-decay")
    zero_gamma: bool = option(True, "γ = 1 on the last BN of residual blocks", flag="--no-zero-gamma")
    bn_momentum: float = option(0.1, "weight of each batch in BN's running statistics",
                                check=checks.within(0, 1, low_open=True, note="torch's convention, the weight "
                                                    "of the new batch's statistics"))
    bn_batch: int = option(0, "BN statistics over groups of N samples, as N samples per worker would give "
                           "(ghost batch norm); 0: each worker's whole batch")
    clip_norm: float = option(0.0, "clip the mean gradient's global norm (over every parameter, a sharded one's "
                              "whole) to this before each step; 0: never (GPT trainers take 1.0)",
                              check=checks.finite_non_negative)
    label_smoothing: float = option(0.0, "cross-entropy label smoothing: weight of the uniform target, in [0, 1)",
                                    check=checks.within(0, 1, high_open=True))
    seed: int = option(0, "seeds the initial weights, each epoch's shuffle and the codecs' sampling", check=checks.seed)

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
    def peak_lr(self) -> float:
        """The rate after scaling for the global batch: the target of warmup."""
        return self.lr_schedule().peak

    def warmup_steps(self, steps_per_epoch: int) -> int:
        """The steps of the rate's warmup (0 without one)."""
        return 0 if self.warmup == "none" else round(self.warmup_epochs * steps_per_epoch)

    def build_optimizer(self, model: nn.Module, momentum_in_exchange: bool = False,
                        freeze_step: int = 0) -> torch.optim.Optimizer:
        """The recipe's optimizer for `model` (`momentum_in_exchange`: the exchange carries the momentum, DGC's
        correction; `freeze_step`: where Adam's variance is frozen, where compression starts)."""
        return build_optimizer(model, self.optimizer, self.peak_lr, self.momentum, self.nesterov,
                               self.weight_decay, self.bias_decay, self.trust_coefficient,
                               momentum_in_exchange=momentum_in_exchange, betas=self.betas,
                               freeze_step=freeze_step, freeze_variance=self.freeze_variance)
