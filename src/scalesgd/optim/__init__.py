"""Optimizers by name: torch's momentum SGD and AdamW, LARS and LAMB for very large minibatches, 1-bit Adam for a
momentum that travels as signs; SGD for an exchange that carries the momentum (DGC's momentum correction)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from scalesgd.optim.lamb import LAMB
from scalesgd.optim.lars import LARS, NaiveLARS
from scalesgd.optim.momentum_corrected import MomentumCorrectedSGD
from scalesgd.optim.onebit_adam import OneBitAdam
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


# name → builder(param_groups, settings)
OPTIMIZERS: Registry[Callable[[list[dict], OptimizerSettings], torch.optim.Optimizer]] = Registry("optimizer")
OPTIMIZERS.add("sgd", lambda groups, s: torch.optim.SGD(groups, lr=s.lr, momentum=s.momentum, nesterov=s.nesterov))
OPTIMIZERS.add("lars", lambda groups, s: LARS(groups, lr=s.lr, momentum=s.momentum, nesterov=s.nesterov,
                                              trust_coefficient=s.trust_coefficient))
OPTIMIZERS.add("lamb", lambda groups, s: LAMB(groups, lr=s.lr, betas=s.betas))
OPTIMIZERS.add("adamw", lambda groups, s: OneBitAdam(groups, lr=s.lr, betas=s.betas, freeze_step=s.freeze_step,
                                                     grad_is_momentum=False)
               if s.freeze_variance else torch.optim.AdamW(groups, lr=s.lr, betas=s.betas))
OPTIMIZERS.add("onebit-adam", lambda groups, s: OneBitAdam(groups, lr=s.lr, betas=s.betas,
                                                           freeze_step=s.freeze_step))

ADAPTIVE = ("lamb", "adamw", "onebit-adam")  # Adam's per-coordinate moments: β1,β2 apply, momentum does not

__all__ = ["ADAPTIVE", "LAMB", "LARS", "OPTIMIZERS", "MomentumCorrectedSGD", "NaiveLARS", "OneBitAdam",
           "OptimizerSettings"]
