"""Optimizers by name: torch's momentum SGD and AdamW, LARS and LAMB for very large minibatches, 1-bit Adam for a
momentum that travels as signs, torch's Muon on the hidden matrices with AdamW on the rest; SGD for an exchange that
carries the momentum (DGC's momentum correction)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from scalesgd.optim.lamb import LAMB
from scalesgd.optim.lars import LARS, NaiveLARS
from scalesgd.optim.momentum_corrected import MomentumCorrectedSGD
from scalesgd.optim.muon import MUON, MuonAdamW
from scalesgd.optim.onebit_adam import EarlyFreezeWarning, OneBitAdam, early_freeze, variance_horizon
from scalesgd.registry import Registry


@dataclass(frozen=True)
class OptimizerSettings:
    """What the recipe gives every optimizer; each takes the settings that apply to it."""

    lr: float
    momentum: float = 0.9  # sgd, lars
    nesterov: bool = False  # sgd, lars
    trust_coefficient: float = 0.001  # lars
    betas: tuple[float, float] = (0.9, 0.999)  # lamb, adamw, onebit-adam
    freeze_step: int = 0  # onebit-adam: the last step with a dense exchange (its variance is frozen after it)
    freeze_variance: bool = False  # adamw: its variance frozen after `freeze_step` too (for a sparse exchange)


@dataclass(frozen=True)
class OptimizerEntry:
    """An optimizer's builder — (param_groups, settings) — and the recipe it brings: the `scalesgd train` options
    (by flat name) it runs at unless the user gives them, where the command line's defaults are momentum SGD's."""

    build: Callable[[list[dict], OptimizerSettings], torch.optim.Optimizer]
    recipe: dict = field(default_factory=dict)
    freezes_variance: bool = False  # Adam's variance frozen where compression starts, always (1-bit Adam)


# Adam's kinds (Loshchilov and Hutter 2019, "Decoupled Weight Decay Regularization"): a rate of Adam's order, the
# betas and decay transformers are trained with, a cosine decay, and the square-root rule for the rate against the
# batch (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms").
ADAM_RECIPE = {"base_lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.1, "schedule": "cosine",
               "lr_scaling": "sqrt"}

OPTIMIZERS: Registry[OptimizerEntry] = Registry("optimizer")
OPTIMIZERS.add("sgd", OptimizerEntry(lambda groups, s: torch.optim.SGD(groups, lr=s.lr, momentum=s.momentum,
                                                                       nesterov=s.nesterov)))
OPTIMIZERS.add("lars", OptimizerEntry(lambda groups, s: LARS(groups, lr=s.lr, momentum=s.momentum,
                                                             nesterov=s.nesterov,
                                                             trust_coefficient=s.trust_coefficient)))
# the rate measured best at 32× (0.004 at a base batch of 32, docs/results.md#large-batch), at the base batch 256
OPTIMIZERS.add("lamb", OptimizerEntry(lambda groups, s: LAMB(groups, lr=s.lr, betas=s.betas),
                                      {"base_lr": 0.032, "schedule": "cosine"}))
OPTIMIZERS.add("adamw", OptimizerEntry(
    lambda groups, s: OneBitAdam(groups, lr=s.lr, betas=s.betas, freeze_step=s.freeze_step, grad_is_momentum=False)
    if s.freeze_variance else torch.optim.AdamW(groups, lr=s.lr, betas=s.betas), ADAM_RECIPE))
OPTIMIZERS.add("onebit-adam", OptimizerEntry(
    lambda groups, s: OneBitAdam(groups, lr=s.lr, betas=s.betas, freeze_step=s.freeze_step), ADAM_RECIPE,
    freezes_variance=True))
# Muon's update RMS matched to AdamW's (0.2·√max(A, B) for an A×B matrix; Liu et al. 2025, "Muon is Scalable for LLM
# Training"), so AdamW's rate and weight decay carry over and muon brings Adam's recipe; torch's momentum 0.95 with
# Nesterov, as Keller Jordan's recipe and MuLoCo (Thérien et al. 2025) run it. The groups mark the hidden matrices
# (`param_groups(..., muon=True)`): the output head, embeddings, biases and norms stay on AdamW.
OPTIMIZERS.add("muon", OptimizerEntry(lambda groups, s: MuonAdamW(groups, lr=s.lr, betas=s.betas), ADAM_RECIPE))

# Adam's per-coordinate moments: β1,β2 apply, momentum does not (muon: its AdamW part's; its matrices' is Muon's own)
ADAPTIVE = ("lamb", "adamw", "onebit-adam", "muon")

__all__ = ["ADAPTIVE", "EarlyFreezeWarning", "LAMB", "LARS", "MUON", "OPTIMIZERS", "MomentumCorrectedSGD",
           "MuonAdamW", "NaiveLARS", "OneBitAdam", "OptimizerEntry", "OptimizerSettings", "early_freeze",
           "variance_horizon"]
