"""The compute side of an iteration: forward time, each tensor's backward time, the optimizer step.

Measured here (a `bench train` directory's layer profile, a `--planner` run's profile.json), or for a
named model on another device: its measured or published iteration time split over the layers in
proportion to their FLOPs, counted by `torch.utils.flop_counter` on meta tensors (nothing allocated).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from scalesgd.models import build_model


@dataclass(frozen=True)
class ComputeProfile:
    """One worker's iteration without exchange: forward, per-tensor backward (forward order), step; seconds."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    t_f: float
    t_b: tuple[float, ...]
    t_step: float
    batch_per_worker: int

    @property
    def compute_s(self) -> float:
        return self.t_f + sum(self.t_b)

    @property
    def iteration_s(self) -> float:
        return self.compute_s + self.t_step

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def scaled_to(self, compute_s: float) -> ComputeProfile:
        """The same shape with forward + backward taking `compute_s`."""
        k = compute_s / self.compute_s if self.compute_s > 0 else 1.0
        return replace(self, t_f=self.t_f * k, t_b=tuple(t * k for t in self.t_b))


def from_layers(layers: dict, t_step: float, batch_per_worker: int) -> ComputeProfile:
    """From the `layers` record of `bench train` or the profile of a `--planner` run (names, sizes, t_f, t_b)."""
    return ComputeProfile(tuple(layers["names"]), tuple(int(s) for s in layers["sizes"]), float(layers["t_f"]),
                          tuple(float(t) for t in layers["t_b"]), t_step, batch_per_worker)


def from_run_dir(run_dir: Path) -> ComputeProfile:
    """A `scalesgd train --planner …` run directory: the profile it measured (its step time is not known: 0)."""
    saved = json.loads((Path(run_dir) / "profile.json").read_text())
    config = json.loads((Path(run_dir) / "config.json").read_text())
    return from_layers(saved["profile"], 0.0, config["batch_size"] // config["workers"])


def from_flops(model_name: str, iteration_s: float, batch_per_worker: int, image_size: int, classes: int,
               channels: int = 3, step_fraction: float = 0.0) -> ComputeProfile:
    """`model_name` on a device where one iteration (forward, backward and step) takes `iteration_s`.

    The time is split by FLOPs: the whole forward's share, and each parameterised module's backward
    (counted by running that module alone on its recorded input, with a gradient for that input only
    where the model needs one) shared by its tensors in proportion to their sizes; `step_fraction`
    of it is the optimizer step.
    """
    with torch.device("meta"):
        model = build_model(model_name, classes, channels)
        x = torch.empty(batch_per_worker, channels, image_size, image_size)
    inputs: dict[str, torch.Tensor] = {}
    owners = {name: module for name, module in model.named_modules()
              if any(p.requires_grad for p in module.parameters(recurse=False))}

    def recorder(name: str):
        def hook(module, args, out) -> None:
            inputs.setdefault(name, args[0])
        return hook

    hooks = [module.register_forward_hook(recorder(name)) for name, module in owners.items()]
    counter = FlopCounterMode(display=False)
    with counter:
        model(x)
    for hook in hooks:
        hook.remove()
    forward = counter.get_total_flops()
    backward_of = {name: _backward_flops(module, inputs[name]) for name, module in owners.items() if name in inputs}
    total = forward + sum(backward_of.values())
    params = [(name, p.numel()) for name, p in model.named_parameters() if p.requires_grad]
    per_module: dict[str, int] = {}
    for name, n in params:
        per_module[name.rpartition(".")[0]] = per_module.get(name.rpartition(".")[0], 0) + n
    compute = iteration_s * (1 - step_fraction)
    t_b = tuple(compute * backward_of.get(name.rpartition(".")[0], 0) / total * n / per_module[name.rpartition(".")[0]]
                for name, n in params)
    return ComputeProfile(tuple(n for n, _ in params), tuple(n for _, n in params), compute * forward / total, t_b,
                          iteration_s * step_fraction, batch_per_worker)


def _backward_flops(module: torch.nn.Module, recorded: torch.Tensor) -> int:
    """FLOPs of `module`'s backward alone: its weights' gradients, and its input's if the model needs that."""
    x = torch.empty_like(recorded, device="meta").requires_grad_(recorded.requires_grad)
    out = module(x)
    counter = FlopCounterMode(display=False)
    with counter:
        out.sum().backward()
    return counter.get_total_flops()
