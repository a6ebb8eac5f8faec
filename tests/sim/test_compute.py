"""Compute profiles: measured ones rescaled, and a named model's iteration split by counted FLOPs."""

import pytest
import torch
from torch import nn

from scalesgd.models import MODELS
from scalesgd.sim.compute import ComputeProfile, from_flops, from_layers


def test_scaling_keeps_the_shape():
    p = from_layers({"names": ["a", "b"], "sizes": [3, 4], "t_f": 1.0, "t_b": [2.0, 1.0]}, 0.5, 16)
    q = p.scaled_to(8.0)
    assert q.compute_s == pytest.approx(8.0) and q.t_b[0] / q.t_b[1] == pytest.approx(2.0)
    assert q.iteration_s == pytest.approx(8.5) and q.numel == 7


def _mlp(num_classes, in_channels):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 4 * 4, 32), nn.ReLU(), nn.Linear(32, num_classes))


def test_flops_split_by_hand_on_a_two_layer_network():
    MODELS.add("test-mlp", _mlp)
    try:
        p = from_flops("test-mlp", 1.0, 8, 4, 10, channels=1, step_fraction=0.1)
    finally:
        MODELS.remove("test-mlp")
    # forward: 2·8·16·32 + 2·8·32·10; backward: first layer its weight gradient only (the input needs none),
    # second layer its weight gradient and its input's; biases' gradients are sums (no matmul FLOPs)
    fwd1, fwd2 = 2 * 8 * 16 * 32, 2 * 8 * 32 * 10
    total = fwd1 + fwd2 + fwd1 + 2 * fwd2
    assert p.t_f == pytest.approx(0.9 * (fwd1 + fwd2) / total)
    weight1, bias1, weight2, bias2 = p.t_b
    assert weight1 + bias1 == pytest.approx(0.9 * fwd1 / total)
    assert weight2 + bias2 == pytest.approx(0.9 * 2 * fwd2 / total)
    assert p.t_step == pytest.approx(0.1) and p.iteration_s == pytest.approx(1.0)


def test_a_real_model_is_split_without_allocating_it():
    p = from_flops("resnet50", 0.3, 32, 224, 1000)
    assert p.numel == 25_557_032 and len(p.t_b) == 161
    assert 1.7 < sum(p.t_b) / p.t_f < 2.05  # backward ≈ twice forward; the first conv needs no input gradient
    assert torch.get_default_device().type == "cpu"
