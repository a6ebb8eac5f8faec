"""The exchange a run's configuration asks for: periodic synchronisation where it takes local steps (ours, or a peer's
for comparison), else its engine with its codec (the loop's and `bench train`'s one way to build it)."""

from __future__ import annotations

import torch
from torch import nn

from scalesgd.comm.engine.exchange import ExchangeSetup, GradientExchange, build_exchange
from scalesgd.config import TrainConfig
from scalesgd.peers.torchft_diloco import TorchftExchange
from scalesgd.periodic.exchange import PeriodicExchange
from scalesgd.periodic.sharded import ShardedPeriodicExchange


def open_exchange(cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                  setup: ExchangeSetup) -> GradientExchange:
    """Wrap `model` and `optimizer` as `cfg` says (collective: every rank, together)."""
    if cfg.periodic.peer == "torchft":
        return TorchftExchange(model, optimizer, setup, cfg.periodic)
    if cfg.periodic.on:
        periodic = ShardedPeriodicExchange if cfg.exchange.sharded else PeriodicExchange
        return periodic(model, optimizer, setup, cfg.periodic)
    return build_exchange(cfg.exchange.engine, model, optimizer, setup)
