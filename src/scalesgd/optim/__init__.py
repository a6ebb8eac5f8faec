"""Optimizers by name: torch's momentum SGD, and LARS for very large minibatches; SGD for an exchange that
carries the momentum (DGC's momentum correction)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from scalesgd.optim.lars import LARS, NaiveLARS
from scalesgd.optim.momentum_corrected import MomentumCorrectedSGD
from scalesgd.registry import Registry

# name → builder(param_groups, lr, momentum, nesterov, trust_coefficient)
OPTIMIZERS: Registry[Callable[..., torch.optim.Optimizer]] = Registry("optimizer")
OPTIMIZERS.add("sgd", lambda groups, lr, momentum, nesterov, trust_coefficient:
               torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov))
OPTIMIZERS.add("lars", lambda groups, lr, momentum, nesterov, trust_coefficient:
               LARS(groups, lr=lr, momentum=momentum, nesterov=nesterov, trust_coefficient=trust_coefficient))

__all__ = ["LARS", "OPTIMIZERS", "MomentumCorrectedSGD", "NaiveLARS"]
