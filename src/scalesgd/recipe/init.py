"""Goyal et al.'s initialisation: He for convolutions, N(0, 0.01) for the classifier, zero-γ."""

from __future__ import annotations

from torch import nn


def initialize(model: nn.Module, zero_gamma: bool = True, bn_momentum: float = 0.1) -> nn.Module:
    """Initialise `model` in place.

    Convolutions and hidden linear layers get He (fan-out) init, normalisation layers γ = 1 and
    β = 0 and a running-average momentum of `bn_momentum` (torch's convention: the new batch's weight), the final classifier `model.fc` weights from N(0, 0.01) with zero bias, and, when
    `zero_gamma`, the `last_bn` of every residual block γ = 0 so each block starts as the identity.
    """
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
            module.momentum = bn_momentum
    nn.init.normal_(model.fc.weight, mean=0.0, std=0.01)
    if model.fc.bias is not None:
        nn.init.zeros_(model.fc.bias)
    if zero_gamma:
        for module in model.modules():
            last_bn = getattr(module, "last_bn", None)
            if isinstance(last_bn, nn.modules.batchnorm._BatchNorm):
                nn.init.zeros_(last_bn.weight)
    return model
