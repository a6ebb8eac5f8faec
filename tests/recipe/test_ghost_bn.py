"""Ghost batch norm: each group of n samples normalised on its own, as n samples per worker would be."""

import pytest
import torch
from torch import nn

from scalesgd.models import build_model
from scalesgd.recipe import initialize
from scalesgd.recipe.ghost_bn import GhostBatchNorm2d, use_ghost_batch


def pair(channels=3, momentum=0.1):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(channels, momentum=momentum)
    nn.init.normal_(bn.weight)
    nn.init.normal_(bn.bias)
    ghost = use_ghost_batch(nn.Sequential(nn.BatchNorm2d(channels, momentum=momentum)), 4)[0]
    ghost.load_state_dict(bn.state_dict())
    return bn, ghost


def test_each_group_is_normalised_on_its_own_with_the_same_gradients():
    bn, ghost = pair()
    x = torch.randn(12, 3, 5, 5) * 3 + 1
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = torch.cat([bn(chunk) for chunk in xa.split(4)])
    got = ghost(xb)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(got)
    (expected * weights).sum().backward()
    (got * weights).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ghost.weight.grad, bn.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ghost.bias.grad, bn.bias.grad, rtol=1e-4, atol=1e-5)


def test_running_statistics_move_once_towards_the_mean_of_the_groups_statistics():
    _, ghost = pair(momentum=0.25)
    x = torch.randn(8, 3, 4, 4) * 2 + 0.5
    ghost(x)
    groups = x.split(4)
    mean = torch.stack([g.mean(dim=(0, 2, 3)) for g in groups]).mean(0)
    var = torch.stack([g.var(dim=(0, 2, 3), unbiased=True) for g in groups]).mean(0)
    torch.testing.assert_close(ghost.running_mean, 0.25 * mean)
    torch.testing.assert_close(ghost.running_var, 0.75 + 0.25 * var)
    assert ghost.num_batches_tracked.item() == 1


def test_a_group_as_large_as_the_batch_and_evaluation_are_plain_batchnorm():
    bn, ghost = pair()
    x = torch.randn(4, 3, 6, 6)
    torch.testing.assert_close(ghost(x), bn(x))
    torch.testing.assert_close(ghost.running_var, bn.running_var)
    bn.eval(), ghost.eval()
    y = torch.randn(16, 3, 6, 6)
    torch.testing.assert_close(ghost(y), bn(y))


def test_a_short_last_batch_normalises_its_remainder_as_a_group():
    bn, ghost = pair()
    x = torch.randn(10, 3, 4, 4)
    expected = torch.cat([bn(chunk) for chunk in x.split(4)])
    torch.testing.assert_close(ghost(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet8", "resnet50"])
def test_every_bn_of_a_model_is_ghosted_in_place_keeping_state_and_references(name):
    model = initialize(build_model(name, 10, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    last = [m.last_bn for m in model.modules() if hasattr(m, "last_bn")]
    use_ghost_batch(model, 8)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(isinstance(m, GhostBatchNorm2d) and m.ghost_batch == 8 for m in bns)
    assert all(isinstance(m, GhostBatchNorm2d) for m in last)
    assert model.state_dict().keys() == before.keys()
    model.train()(torch.randn(16, 3, 32, 32))


def test_zero_leaves_the_model_as_it_was():
    model = build_model("resnet8", 10, 3)
    use_ghost_batch(model, 0)
    assert not any(isinstance(m, GhostBatchNorm2d) for m in model.modules())
