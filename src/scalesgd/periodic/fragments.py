"""Which parameters synchronise together, and when: the model cut into fragments of whole layers, and the staggered
schedule on which each fragment's pseudo-gradient starts its exchange and lands (Douillard et al. 2025, "Streaming
DiLoCo with overlapping communication")."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Schedule:
    """When each of `fragments` fragments synchronises within rounds of `local_steps` inner steps: fragment f lands
    after inner steps (k·F + f + 1)·H/F, its exchange started `delay` steps (τ) earlier and running meanwhile. With
    one fragment and no delay it is DiLoCo's: everything every H steps."""

    local_steps: int
    fragments: int = 1
    delay: int = 0

    def __post_init__(self):
        if self.local_steps < 1:
            raise ValueError(f"local_steps {self.local_steps}: give at least 1")
        if self.fragments < 1 or self.local_steps % self.fragments:
            raise ValueError(f"fragments {self.fragments}: give a divisor of local_steps {self.local_steps}")
        if not 0 <= self.delay < self.period:
            raise ValueError(f"delay {self.delay}: give 0 to {self.period - 1} (a fragment's exchange lands before "
                             f"its next one starts, every local_steps/fragments = {self.period} steps)")

    @property
    def period(self) -> int:
        """Inner steps between one fragment's landing and the next fragment's."""
        return self.local_steps // self.fragments

    def lands(self, step: int) -> int | None:
        """The fragment whose exchange lands after inner step `step` (counted from 1), or None."""
        return (step // self.period - 1) % self.fragments if step >= 1 and step % self.period == 0 else None

    def starts(self, step: int) -> int | None:
        """The fragment whose exchange starts after inner step `step`, or None."""
        return self.lands(step + self.delay)
