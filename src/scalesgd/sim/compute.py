"""The compute side of an iteration: forward time, each tensor's backward time, the optimizer step.

Measured here (a `bench train` directory's layer profile, a `--planner` run's profile.json), or for a
named model on another device: its measured or published iteration time split over the layers in
proportion to their FLOPs, counted by `torch.utils.flop_counter` on meta tensors (nothing allocated), images or
a language model's token sequences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from scalesgd.models import MODELS, TEXT, ModelOptions, build_model


@dataclass(frozen=True)
class ComputeProfile:
    """One worker's iteration without exchange: forward, per-tensor backward (forward order) of one micro-batch,
    the micro-batches of a step (the ones before the last only compute: the exchange overlaps the last), step;
    seconds."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    t_f: float
    t_b: tuple[float, ...]
    t_step: float
    batch_per_worker: int  # samples of one micro-batch
    accumulate: int = 1  # micro-batches per step
    shapes: tuple[tuple[int, ...], ...] = ()  # each tensor's shape (what a low-rank codec factors; () where unknown)
    units: tuple[str, ...] = ()  # the modules the sharded engine shards one by one (forward order; () where unknown)

    @property
    def compute_s(self) -> float:
        """One micro-batch's forward and backward."""
        return self.t_f + sum(self.t_b)

    @property
    def accumulating_s(self) -> float:
        """The micro-batches before the last: forward and backward with nothing to exchange."""
        return (self.accumulate - 1) * self.compute_s

    @property
    def iteration_s(self) -> float:
        return self.accumulating_s + self.compute_s + self.t_step

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def layers(self) -> int:
        """The layers with parameters (the modules its tensors belong to): what periodic fragments are cut from."""
        return len(dict.fromkeys(name.rpartition(".")[0] for name in self.names))

    def scaled_to(self, compute_s: float) -> ComputeProfile:
        """The same shape with forward + backward taking `compute_s`."""
        k = compute_s / self.compute_s if self.compute_s > 0 else 1.0
        return replace(self, t_f=self.t_f * k, t_b=tuple(t * k for t in self.t_b))


def from_layers(layers: dict, t_step: float, batch_per_worker: int) -> ComputeProfile:
    """From the `layers` record of `bench train` or the profile of a `--planner` run (names, sizes, t_f, t_b)."""
    return ComputeProfile(tuple(layers["names"]), tuple(int(s) for s in layers["sizes"]), float(layers["t_f"]),
                          tuple(float(t) for t in layers["t_b"]), t_step, batch_per_worker,
                          shapes=tuple(tuple(int(d) for d in shape) for shape in layers.get("shapes", ())))


def model_shapes(model_name: str, classes: int, channels: int = 3,
                 options: ModelOptions | None = None) -> tuple[tuple[int, ...], ...]:
    """The shapes of `model_name`'s trainable tensors (forward order), built on meta tensors (nothing allocated)."""
    with torch.device("meta"):
        model = build_model(model_name, classes, channels, options or ModelOptions())
    return tuple(tuple(p.shape) for p in model.parameters() if p.requires_grad)


def unit_names(model: torch.nn.Module, model_name: str) -> tuple[str, ...]:
    """The modules of `model` that the sharded engine shards one by one (a GPT's blocks, a ResNet's stages), by name."""
    units = set(map(id, MODELS[model_name].shard_units(model)))
    return tuple(name for name, module in model.named_modules() if id(module) in units)


def from_run_dir(run_dir: Path) -> ComputeProfile:
    """A `scalesgd train --planner …` run directory: the profile it measured (its step time is not known: 0)."""
    saved = json.loads((Path(run_dir) / "profile.json").read_text())
    config = json.loads((Path(run_dir) / "config.json").read_text())
    return from_layers(saved["profile"], 0.0, config["batch_size"] // config["workers"])


def from_flops(model_name: str, iteration_s: float, batch_per_worker: int, image_size: int, classes: int,
               channels: int = 3, step_fraction: float = 0.0, options: ModelOptions | None = None) -> ComputeProfile:
    """`model_name` on a device where one iteration (forward, backward and step) takes `iteration_s`.

    The time is split by FLOPs (`count_flops`): the whole forward's share, and each tensor's share of the
    backward; `step_fraction` of it is the optimizer step. An image model reads `batch_per_worker` images of
    `channels`×`image_size`², a language model as many sequences of its context length (`options`' block) over a
    vocabulary of `classes` tokens.
    """
    flops = count_flops(model_name, batch_per_worker, image_size, classes, channels, options)
    total = flops.forward + sum(flops.backward)
    compute = iteration_s * (1 - step_fraction)
    return ComputeProfile(flops.names, flops.sizes, compute * flops.forward / total,
                          tuple(compute * b / total for b in flops.backward), iteration_s * step_fraction,
                          batch_per_worker, shapes=flops.shapes, units=flops.units)


@dataclass(frozen=True)
class Flops:
    """A model's FLOPs for one batch: the forward, and each trainable tensor's share of the backward (forward
    order; a tied tensor once, under its first name)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    forward: int
    backward: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...] = ()
    units: tuple[str, ...] = ()  # the modules the sharded engine shards one by one


def count_flops(model_name: str, batch: int, image_size: int, classes: int, channels: int = 3,
                options: ModelOptions | None = None) -> Flops:
    """Forward and backward of `model_name` on one batch, counted on meta tensors (nothing allocated).

    Each tensor's share of the backward is what the backward computes between the moment the tensor before it
    (in gradient-ready order) has its gradient and the moment this one has: as `bench train` measures times
    (`comm.cost.profile.time_layers`). So a layer's weight carries its own gradients' and its input's, a
    parameter-free operation's (attention's) goes to the first tensor ready after it, and a tensor used twice (a
    tied embedding) is ready once, after its last use's backward. Only what the model needs is counted: no
    gradient for the input.
    """
    options = options or ModelOptions()
    with torch.device("meta"):
        model = build_model(model_name, classes, channels, options)
        if MODELS[model_name].data == TEXT:
            x = torch.empty(batch, options["gpt"].block, dtype=torch.long)
        else:
            x = torch.empty(batch, channels, image_size, image_size)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    counter = FlopCounterMode(display=False)
    ready: dict[int, int] = {}  # tensor index → FLOPs counted when its gradient was ready, in the order they were

    def stamp(i: int):
        def hook(_) -> None:
            ready[i] = counter.get_total_flops()
        return hook

    hooks = [p.register_post_accumulate_grad_hook(stamp(i)) for i, (_, p) in enumerate(named)]
    try:
        with counter:
            out = model(x)
            forward = counter.get_total_flops()
            out.sum().backward()
    finally:
        for hook in hooks:
            hook.remove()
    backward, last = [0] * len(named), forward
    for i, at in ready.items():  # a dict keeps the order the hooks fired in
        backward[i], last = at - last, at
    return Flops(tuple(n for n, _ in named), tuple(p.numel() for _, p in named), forward, tuple(backward),
                 tuple(tuple(p.shape) for _, p in named), unit_names(model, model_name))
