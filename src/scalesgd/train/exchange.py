"""The exchange a run's configuration asks for: periodic synchronisation where it takes local steps (ours over the
engine each replica runs inside itself, or a peer's for comparison), else its engine with its codec (the loop's and
`bench train`'s one way to build it)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from scalesgd.comm.codecs import CODECS
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.engine.exchange import ExchangeSetup, GradientExchange, LocalExchange, build_exchange
from scalesgd.comm.engine.fsdp import FsdpExchange
from scalesgd.comm.engine.fsdp_sums import cross_node_channel
from scalesgd.config import TrainConfig
from scalesgd.peers.torchft_diloco import TorchftExchange
from scalesgd.periodic.exchange import PeriodicExchange


def open_exchange(cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                  setup: ExchangeSetup) -> GradientExchange:
    """Wrap `model` and `optimizer` as `cfg` says (collective: every rank, together)."""
    if cfg.periodic.peer == "torchft":
        return TorchftExchange(model, optimizer, setup, cfg.periodic)
    if cfg.periodic.on:
        return PeriodicExchange(*replica_exchange(cfg, model, optimizer, setup), cfg.periodic)
    return build_exchange(cfg.exchange.engine, model, optimizer, setup)


def replica_exchange(cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                     setup: ExchangeSetup) -> tuple[GradientExchange, ExchangeSetup]:
    """What each replica runs inside itself every step, and where the replicas synchronise: a process alone, in the
    run's exchange group; or a node's processes, in fp32 with the run's engine over the node (its shards where
    sharded), the replicas one a node in the cross-node group."""
    if cfg.replica_scope != "node":
        return LocalExchange(model, optimizer, setup), setup
    groups = setup.topology
    inside = replace(setup, codec=DENSE.name, compress_after=0, group=groups.node_group,
                     process_group=groups.node_group)
    if cfg.exchange.sharded:
        within = FsdpExchange(model, optimizer, inside, across_nodes=False)
    else:
        within = build_exchange(cfg.exchange.engine, model, optimizer, inside)
    across = cross_node_channel(groups, CODECS[setup.codec].needs_topology)
    return within, replace(setup, group=across.group, topology=across.topology)
