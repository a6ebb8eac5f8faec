"""Models by name: the registry the command line, the benchmarks and the trainers read, and the option families of
the models that have size options (`--gpt-layers`, …)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from scalesgd import checks
from scalesgd.models.gpt import GPT, GptOptions, gpt
from scalesgd.models.resnet50 import resnet50
from scalesgd.models.resnet_cifar import resnet8, resnet20, resnet56
from scalesgd.models.vgg import vgg16
from scalesgd.options import refuse
from scalesgd.registry import OptionFamilies, Registry

MAX_CLASSES, MAX_CHANNELS = 100_000, 1024  # ImageNet-21k has 21,841 classes; images have a few channels

IMAGE, TEXT = "image", "text"  # what a model reads: (N, C, H, W) images, or (N, T) tokens

MODEL_OPTIONS: Registry[type] = Registry("model option family")  # family (the model's name) → its options class
MODEL_OPTIONS.add("gpt", GptOptions)


class ModelOptions(OptionFamilies):
    """One options object per model with size options, its defaults where none was given."""

    registry = MODEL_OPTIONS


@dataclass(frozen=True)
class ModelEntry:
    """A model's builder — (classes or vocabulary size, input channels, every model's options) — and what it reads."""

    build: Callable[[int, int, ModelOptions], nn.Module]
    data: str = IMAGE
    recipe: dict = field(default_factory=dict)  # `scalesgd train` options (by flat name) it runs at unless given
    # the modules the sharded engines shard one by one before the rest (a block, a stage: gathered one at a time)
    shard_units: Callable[[nn.Module], list[nn.Module]] = lambda model: []


# the GPT on text as transformers are trained (docs/results.md#language-model): AdamW, 512 steps of 64 sequences,
# the first 1/16 of them warming up, then cosine
GPT_RECIPE = {"optimizer": "adamw", "batch_size": 64, "base_batch": 64, "samples": 16384, "epochs": 2,
              "warmup_epochs": 0.125, "schedule": "cosine"}


def _image(builder: Callable[[int, int], nn.Module], units: tuple[str, ...]) -> ModelEntry:
    return ModelEntry(lambda classes, channels, options: builder(classes, channels),
                      shard_units=lambda model: [model.get_submodule(name) for name in units])


CIFAR_STAGES = ("layer1", "layer2", "layer3")
MODELS: Registry[ModelEntry] = Registry("model")
MODELS.add("resnet8", _image(resnet8, CIFAR_STAGES))
MODELS.add("resnet20", _image(resnet20, CIFAR_STAGES))
MODELS.add("resnet56", _image(resnet56, CIFAR_STAGES))
MODELS.add("resnet50", _image(resnet50, (*CIFAR_STAGES, "layer4")))
MODELS.add("vgg16", _image(vgg16, ("features", "classifier")))


def _gpt(vocab: int, channels: int, options: ModelOptions) -> nn.Module:
    return gpt(vocab, options["gpt"])


MODELS.add("gpt", ModelEntry(_gpt, TEXT, GPT_RECIPE, shard_units=lambda model: list(model.blocks)))


def build_model(name: str, num_classes: int, in_channels: int, options: ModelOptions | None = None) -> nn.Module:
    """Build the registered model `name` (`num_classes`: a language model's vocabulary, which reads no channels); a
    KeyError names the known ones otherwise, a UsageError a size that is no layer's (torch's own error would be a
    traceback)."""
    entry = MODELS[name]
    sizes = (("classes", num_classes, MAX_CLASSES),) + ((("in_channels", in_channels, MAX_CHANNELS),)
                                                        if entry.data == IMAGE else ())
    for option, value, most in sizes:
        refuse(option, value, checks.positive(value) or checks.within(1, most, note="wider than any data set")(value))
    return entry.build(num_classes, in_channels, options or ModelOptions())


__all__ = [
    "GPT",
    "IMAGE",
    "MODELS",
    "MODEL_OPTIONS",
    "TEXT",
    "ModelEntry",
    "ModelOptions",
    "build_model",
    "gpt",
    "resnet8",
    "resnet20",
    "resnet50",
    "resnet56",
    "vgg16",
]
