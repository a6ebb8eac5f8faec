"""The residual blocks: the BN before the addition (zero-γ's target), and the shortcut a changed shape needs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scalesgd.models.resnet50 import Bottleneck
from scalesgd.models.resnet_cifar import BasicBlock


@pytest.mark.parametrize(
    "block, in_ch, stride",
    [
        (lambda: BasicBlock(16, 16, 1), 16, 1),
        (lambda: BasicBlock(16, 32, 2), 16, 2),
        (lambda: Bottleneck(64, 64, 1), 64, 1),
        (lambda: Bottleneck(256, 64, 1), 256, 1),
        (lambda: Bottleneck(256, 128, 2), 256, 2),
    ],
)
def test_last_bn_is_the_bn_just_before_the_addition(block, in_ch, stride):
    # With last_bn's gamma and beta at zero the residual branch vanishes,
    # so the block must reduce to relu(shortcut(x)).
    torch.manual_seed(0)
    b = block().eval()
    x = torch.randn(2, in_ch, 8, 8)
    with torch.no_grad():
        before = b(x)
        assert not torch.allclose(before, torch.relu(b.shortcut(x)))
        b.last_bn.weight.zero_()
        b.last_bn.bias.zero_()
        after = b(x)
    assert torch.allclose(after, torch.relu(b.shortcut(x)))
    assert after.shape[-1] == 8 // stride



def test_shortcut_is_projection_only_when_shape_changes():
    assert isinstance(BasicBlock(16, 16, 1).shortcut, nn.Identity)
    proj = BasicBlock(16, 32, 2).shortcut
    assert isinstance(proj, nn.Sequential)
    assert isinstance(proj[0], nn.Conv2d) and proj[0].kernel_size == (1, 1) and proj[0].stride == (2, 2)
    assert isinstance(proj[1], nn.BatchNorm2d)
    assert isinstance(Bottleneck(256, 64, 1).shortcut, nn.Identity)
    assert isinstance(Bottleneck(64, 64, 1).shortcut, nn.Sequential)
