"""Model zoo: a name -> builder registry so the CLI and trainers pick models by string."""

from __future__ import annotations

from typing import Callable

from torch import nn

from scalesgd.models.resnet50 import resnet50
from scalesgd.models.resnet_cifar import resnet8, resnet20, resnet56
from scalesgd.models.vgg import vgg16

MODELS: dict[str, Callable[[int, int], nn.Module]] = {
    "resnet8": resnet8,
    "resnet20": resnet20,
    "resnet56": resnet56,
    "resnet50": resnet50,
    "vgg16": vgg16,
}


def build_model(name: str, num_classes: int, in_channels: int) -> nn.Module:
    """Build the registered model `name`; raises KeyError for an unknown name."""
    try:
        builder = MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None
    return builder(num_classes, in_channels)


__all__ = ["MODELS", "build_model", "resnet8", "resnet20", "resnet56", "resnet50", "vgg16"]
