"""Compute profiles: measured ones rescaled, and a named model's iteration split by counted FLOPs."""

import pytest
import torch
from torch import nn

from scalesgd.models import MODELS, ModelEntry, ModelOptions
from scalesgd.models.gpt import GptOptions, gpt
from scalesgd.sim.compute import count_flops, from_flops, from_layers


def test_scaling_keeps_the_shape():
    p = from_layers({"names": ["a", "b"], "sizes": [3, 4], "t_f": 1.0, "t_b": [2.0, 1.0]}, 0.5, 16)
    q = p.scaled_to(8.0)
    assert q.compute_s == pytest.approx(8.0) and q.t_b[0] / q.t_b[1] == pytest.approx(2.0)
    assert q.iteration_s == pytest.approx(8.5) and q.numel == 7


def _mlp(num_classes, in_channels):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 4 * 4, 32), nn.ReLU(), nn.Linear(32, num_classes))


def test_flops_split_by_hand_on_a_two_layer_network():
    MODELS.add("test-mlp", ModelEntry(lambda classes, channels, options: _mlp(classes, channels)))
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


def test_a_gpt_is_split_on_token_batches_its_tied_embedding_once():
    options = GptOptions(layers=2, heads=2, width=32, block=16)
    p = from_flops("gpt", 0.5, 4, 0, 256, step_fraction=0.1, options=ModelOptions.of(options))
    net = gpt(256, options)
    assert p.names == tuple(name for name, _ in net.named_parameters())  # the head's weight is the embedding's
    assert p.names.count("tok.weight") == 1 and "head.weight" not in p.names and p.numel == sum(
        t.numel() for t in net.parameters())
    assert p.t_f + sum(p.t_b) == pytest.approx(0.45) and p.iteration_s == pytest.approx(0.5)
    share = {name: t for name, t in zip(p.names, p.t_b)}
    qkv, proj = (share[f"blocks.0.attn.{m}.weight"] + share[f"blocks.0.attn.{m}.bias"] for m in ("qkv", "proj"))
    # the projection's backward is 2·2·(4·16)·32·32 FLOPs; the qkv tensors are ready after attention's backward (four
    # products of 2·4·16²·32: as many) and their own (three times the projection's): 4 × as many
    assert qkv == pytest.approx(4 * proj)


def test_a_gpt_s_flops_are_kaplan_s_estimate_three_times():
    """Forward + backward ≈ 3 × forward, the forward ≈ `flops_per_token` and the tied head's 2·vocab·width per
    token (which it leaves out). Within 1 %: the counter counts the whole T×T attention (4·T·width per layer and
    token, the estimate 2·T·width) and no bias or LayerNorm arithmetic (the estimate's 2·N counts 2 per parameter):
    here 2·2·16·32 − 2·896 = 256 FLOPs per token more, of 69,376."""
    options = GptOptions(layers=2, heads=2, width=32, block=16)
    flops = count_flops("gpt", 4, 0, 256, options=ModelOptions.of(options))
    per_token = gpt(256, options).flops_per_token() + 2 * 256 * 32
    assert flops.forward + sum(flops.backward) == pytest.approx(3 * per_token * 4 * 16, rel=0.01)
    assert sum(flops.backward) == 2 * flops.forward  # every matmul's backward is two: the input needs its gradient
