import pytest
import torch
from torch import nn

from scalesgd.models import build_model
from scalesgd.recipe import initialize


@pytest.mark.parametrize("name", ["resnet8", "resnet20", "resnet50"])
def test_zero_gamma_on_last_bn_of_every_residual_block_and_one_elsewhere(name):
    torch.manual_seed(0)
    model = initialize(build_model(name, 10, 3), zero_gamma=True)
    last = {id(m.last_bn) for m in model.modules() if hasattr(m, "last_bn")}
    assert last
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            expected = 0.0 if id(m) in last else 1.0
            assert torch.all(m.weight == expected) and torch.all(m.bias == 0)


def test_without_zero_gamma_every_bn_gamma_is_one():
    model = initialize(build_model("resnet20", 10, 3), zero_gamma=False)
    assert all(torch.all(m.weight == 1) for m in model.modules() if isinstance(m, nn.BatchNorm2d))


def test_classifier_from_normal_0_01_and_convs_he_init():
    torch.manual_seed(0)
    model = initialize(build_model("resnet50", 1000, 3))
    assert model.fc.weight.std().item() == pytest.approx(0.01, rel=0.02)
    assert torch.all(model.fc.bias == 0)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.weight.numel() > 100_000]
    for c in convs:
        fan_out = c.out_channels * c.kernel_size[0] * c.kernel_size[1]
        assert c.weight.std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.05)


def test_zero_gamma_makes_every_residual_block_start_as_identity_plus_relu():
    torch.manual_seed(0)
    model = initialize(build_model("resnet20", 10, 3)).eval()
    block = next(m for m in model.modules() if hasattr(m, "last_bn") and getattr(m, "shortcut", None) is not None
                 and len(list(m.shortcut.parameters())) == 0)
    x = torch.randn(2, block.last_bn.num_features, 8, 8)
    assert torch.allclose(block(x), torch.relu(x))


def test_bn_momentum_is_set_on_every_batchnorm():
    model = initialize(build_model("resnet20", 10, 3), bn_momentum=0.03)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(m.momentum == 0.03 for m in bns)
