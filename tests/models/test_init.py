"""The model registry and what every model shares: shapes, parameter counts, the fc / last_bn conventions,
gradients reaching every parameter."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scalesgd.errors import UsageError
from scalesgd.models import MODELS, TEXT, ModelOptions, build_model
from scalesgd.models.gpt import GptOptions
from scalesgd.models.resnet50 import Bottleneck
from scalesgd.models.resnet_cifar import BasicBlock

ALL_NAMES = ["resnet8", "resnet20", "resnet56", "resnet50", "vgg16"]  # the image classifiers


def _count(model: nn.Module) -> int:
    """Total number of parameter elements."""
    return sum(p.numel() for p in model.parameters())



def _blocks_with_last_bn(model: nn.Module) -> list[nn.Module]:
    """Submodules that expose the `last_bn` convention."""
    return [m for m in model.modules() if hasattr(m, "last_bn")]



def test_registry_has_the_image_classifiers_and_the_language_model():
    assert sorted(MODELS) == sorted(ALL_NAMES + ["gpt"])
    assert [name for name, entry in MODELS.items() if entry.data == TEXT] == ["gpt"]
    assert all(callable(entry.build) for entry in MODELS.values())


def test_build_model_passes_the_gpt_its_size_options_and_checks_no_channels():
    options = ModelOptions.of(GptOptions(layers=1, width=32, heads=2, block=16))
    model = build_model("gpt", 256, 0, options)
    assert len(model.blocks) == 1 and model.tok.weight.shape == (256, 32)



def test_build_model_unknown_name_raises_key_error():
    with pytest.raises(KeyError):
        build_model("resnet9000", 10, 3)



@pytest.mark.parametrize("classes,channels,message", [(0, 3, "`classes` 0: must be a positive number"),
                                                      (-1, 3, "`classes` -1: must be a positive number"),
                                                      (10, 0, "`in_channels` 0: must be a positive number"),
                                                      (10**30, 3, "`classes` 10000000000")])
def test_build_model_refuses_sizes_no_layer_has_in_one_usage_error(classes, channels, message):
    with pytest.raises(UsageError) as err:
        build_model("resnet8", classes, channels)
    assert str(err.value).startswith(message)



@pytest.mark.parametrize("name", ALL_NAMES)
def test_build_model_returns_fresh_module_of_registered_builder(name):
    a = build_model(name, 7, 2)
    b = MODELS[name].build(7, 2, ModelOptions())
    assert type(a) is type(b)
    assert a is not b
    assert _count(a) == _count(b)
    assert a.fc.out_features == 7



@pytest.mark.parametrize(
    "name, size, channels",
    [
        (n, s, c)
        for n in ALL_NAMES
        for s in (8, 32) + ((64,) if n == "resnet50" else ())
        for c in (1, 3)
    ],
)
def test_output_shape(name, size, channels):
    torch.manual_seed(0)
    model = build_model(name, 5, channels).eval()
    x = torch.randn(2, channels, size, size)
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, 5)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()



@pytest.mark.parametrize("name", ["resnet8", "resnet20", "vgg16", "resnet50"])
def test_tiny_inputs_work(name):
    model = build_model(name, 3, 3).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 1, 1))
    assert out.shape == (2, 3)



@pytest.mark.parametrize(
    "name, classes, expected",
    [
        ("resnet8", 10, 78_042),
        ("resnet20", 10, 272_474),
        ("resnet56", 10, 855_770),
        ("resnet50", 1000, 25_557_032),
        ("vgg16", 10, 15_249_354),
    ],
)
def test_parameter_count(name, classes, expected):
    assert _count(build_model(name, classes, 3)) == expected



def test_input_channels_only_change_the_stem():
    # Stem conv weights scale with in_channels; nothing else does.
    assert _count(build_model("resnet20", 10, 1)) == 272_474 - 2 * 16 * 9
    assert _count(build_model("resnet50", 1000, 1)) == 25_557_032 - 2 * 64 * 49
    assert _count(build_model("vgg16", 10, 1)) == 15_249_354 - 2 * 64 * 9



@pytest.mark.parametrize("name", ALL_NAMES)
def test_fc_is_the_final_classifier(name):
    model = build_model(name, 13, 3).eval()
    assert isinstance(model.fc, nn.Linear)
    assert model.fc.out_features == 13
    # Prove fc produces the logits: zeroing it makes the output its bias exactly.
    with torch.no_grad():
        model.fc.weight.zero_()
        model.fc.bias.copy_(torch.arange(13, dtype=torch.float32))
        out = model(torch.randn(2, 3, 16, 16))
    assert torch.equal(out, torch.arange(13, dtype=torch.float32).expand(2, 13))



@pytest.mark.parametrize(
    "name, n_blocks", [("resnet8", 3), ("resnet20", 9), ("resnet56", 27), ("resnet50", 16), ("vgg16", 0)]
)
def test_last_bn_block_count(name, n_blocks):
    model = build_model(name, 10, 3)
    blocks = _blocks_with_last_bn(model)
    assert len(blocks) == n_blocks
    assert all(isinstance(b.last_bn, nn.BatchNorm2d) for b in blocks)
    expected_type = {"resnet50": Bottleneck}.get(name, BasicBlock)
    assert all(isinstance(b, expected_type) for b in blocks)



@pytest.mark.parametrize("name", ALL_NAMES)
def test_layer_conventions(name):
    model = build_model(name, 10, 3)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(c.bias is None for c in convs)
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    assert relus and not any(r.inplace for r in relus)
    # No special init inside the models: BN stays at PyTorch defaults.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)



@pytest.mark.parametrize("name, size", [(n, 32) for n in ALL_NAMES] + [("resnet8", 8), ("vgg16", 8)])
def test_gradients_reach_every_parameter(name, size):
    torch.manual_seed(0)
    model = build_model(name, 10, 3).train()
    x = torch.randn(4, 3, size, size)
    y = torch.randint(0, 10, (4,))
    nn.functional.cross_entropy(model(x), y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname
