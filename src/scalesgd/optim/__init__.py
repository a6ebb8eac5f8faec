"""Optimizers by name: torch's momentum SGD, and LARS and LAMB for very large minibatches; SGD for an exchange
that carries the momentum (DGC's momentum correction)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from scalesgd.optim.lamb import LAMB
from scalesgd.optim.lars import LARS, NaiveLARS
from scalesgd.optim.momentum_corrected import MomentumCorrectedSGD
from scalesgd.registry import Registry

# name → builder(param_groups, lr, momentum, nesterov, trust_coefficient)
OPTIMIZERS: Registry[Callable[..., torch.optim.Optimizer]] = Registry("optimizer")
OPTIMIZERS.add("sgd", lambda groups, lr, momentum, nesterov, trust_coefficient:
               torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov))
OPTIMIZERS.add("lars", lambda groups, lr, momentum, nesterov, trust_coefficient:
               LARS(groups, lr=lr, momentum=momentum, nesterov=nesterov, trust_coefficient=trust_coefficient))
# Adam's moments at their default betas: the recipe's momentum, nesterov and trust coefficient do not apply
OPTIMIZERS.add("lamb", lambda groups, lr, momentum, nesterov, trust_coefficient: LAMB(groups, lr=lr))

__all__ = ["LAMB", "LARS", "OPTIMIZERS", "MomentumCorrectedSGD", "NaiveLARS"]
