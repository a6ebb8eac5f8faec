"""The outer optimizer that steps the global parameters with the mean pseudo-gradient: DiLoCo's Nesterov SGD
(Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models": lr 0.7, momentum 0.9);
plain averaging of the workers' parameters is the same at lr 1 without momentum."""

from __future__ import annotations

import torch

OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9


def outer_sgd(params, lr: float = OUTER_LR, momentum: float = OUTER_MOMENTUM) -> torch.optim.SGD:
    """DiLoCo's outer optimizer over `params`: SGD with Nesterov momentum (plain SGD where `momentum` is 0)."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=momentum > 0)
