"""Which parameters synchronise together: the model cut into fragments of whole layers (Douillard et al. 2025,
"Streaming DiLoCo with overlapping communication"); when each synchronises is the `Schedule`'s."""

from __future__ import annotations

from torch import nn


def layers(model: nn.Module) -> list[list[nn.Parameter]]:
    """The model's trainable parameters grouped by the module that holds them (a layer's weight and bias together),
    in registration order, each once."""
    groups, seen = [], set()
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        seen.update(map(id, own))  # a tied weight (a GPT's embedding and head) belongs to its first layer
        if own:
            groups.append(own)
    return groups


def split(model: nn.Module, fragments: int) -> list[list[nn.Parameter]]:
    """The model's layers in order, cut into `fragments` contiguous runs of about equal numbers of parameters, so each
    fragment's exchange moves about 1/F of the model."""
    groups = layers(model)
    if fragments < 1 or fragments > len(groups):
        raise ValueError(f"fragments {fragments}: give 1 to {len(groups)} (the model's layers with parameters)")
    before = [0]  # parameters before each layer boundary
    for group in groups:
        before.append(before[-1] + sum(p.numel() for p in group))
    cuts: list[int] = []
    for k in range(1, fragments):  # each cut at the boundary nearest its share, leaving a layer for every fragment
        low, high = (cuts[-1] if cuts else 0) + 1, len(groups) - (fragments - k)
        cuts.append(min(range(low, high + 1), key=lambda i: abs(before[i] - before[-1] * k / fragments)))
    bounds = [0, *cuts, len(groups)]
    return [[p for group in groups[a:b] for p in group] for a, b in zip(bounds, bounds[1:])]
