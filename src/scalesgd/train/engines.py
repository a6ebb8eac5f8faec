"""Wrapping the model in the chosen gradient-exchange engine."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalesgd.train.distributed import DistEnv


def wrap(engine: str, model: nn.Module, env: DistEnv) -> nn.Module:
    """The module the loop runs forward/backward through; its backward averages gradients over ranks."""
    if engine == "ddp":
        device_ids = [env.device.index] if env.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    raise ValueError(f"unknown engine {engine!r}")
