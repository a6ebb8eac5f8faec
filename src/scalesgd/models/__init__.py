"""Models by name: the registry the command line, the benchmarks and the trainers read."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from scalesgd import checks
from scalesgd.models.resnet50 import resnet50
from scalesgd.models.resnet_cifar import resnet8, resnet20, resnet56
from scalesgd.models.vgg import vgg16
from scalesgd.options import refuse
from scalesgd.registry import Registry

MAX_CLASSES, MAX_CHANNELS = 100_000, 1024  # ImageNet-21k has 21,841 classes; images have a few channels

# name → builder(num_classes, in_channels)
MODELS: Registry[Callable[[int, int], nn.Module]] = Registry("model")
MODELS.add("resnet8", resnet8)
MODELS.add("resnet20", resnet20)
MODELS.add("resnet56", resnet56)
MODELS.add("resnet50", resnet50)
MODELS.add("vgg16", vgg16)


def build_model(name: str, num_classes: int, in_channels: int) -> nn.Module:
    """Build the registered model `name`; a KeyError names the known ones otherwise, a UsageError a size that is no
    layer's (torch's own error would be a traceback)."""
    for option, value, most in (("classes", num_classes, MAX_CLASSES), ("in_channels", in_channels, MAX_CHANNELS)):
        refuse(option, value, checks.positive(value) or checks.within(1, most, note="wider than any data set")(value))
    return MODELS[name](num_classes, in_channels)


__all__ = ["MODELS", "build_model", "resnet8", "resnet20", "resnet56", "resnet50", "vgg16"]
