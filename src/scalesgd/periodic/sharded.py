"""Periodic synchronisation of a model sharded within each node (FSDP2's hybrid layout with DiLoCo across nodes):
each node is one DiLoCo worker whose ranks reduce-scatter every step inside it, and every H steps each rank's
shards' pseudo-gradient travels through the codec to the ranks holding the same shards on the other nodes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace

import torch
from torch import nn

from scalesgd.comm.codecs import CODECS
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.engine.base import ExchangeSetup
from scalesgd.comm.engine.fsdp import FsdpExchange, shard_layout
from scalesgd.comm.engine.fsdp_sums import cross_node_channel
from scalesgd.comm.engine.optimizer import IterationStats
from scalesgd.optim._batched import local
from scalesgd.periodic.config import PeriodicConfig
from scalesgd.periodic.exchange import PeriodicExchange


class ShardedPeriodicExchange(PeriodicExchange):
    """`PeriodicExchange` over the cross-node group on a model `shard_model` sharded within each node: backward's
    reduce-scatter, accumulation and the sharded checkpoint are the node's (`FsdpExchange`, fp32); the round's, the
    local shards and the inner optimizer's state are each rank's own, kept where the shards are the same."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, setup: ExchangeSetup,
                 periodic: PeriodicConfig):
        if setup.topology is None:
            raise ValueError("periodic synchronisation of shards needs the node and cross-node groups (`topology`)")
        self.within = FsdpExchange(model, optimizer, replace(setup, codec=DENSE.name), across_nodes=False)
        self._layout = shard_layout(model)
        across = cross_node_channel(setup.topology, CODECS[setup.codec].needs_topology)
        super().__init__(model, optimizer, replace(setup, group=across.group, topology=across.topology), periodic)

    def autocast(self) -> AbstractContextManager:
        return self.within.autocast()  # bf16 compute is FSDP's own

    def no_sync(self) -> AbstractContextManager:
        return self.within.no_sync()

    @contextmanager
    def evaluated(self) -> Iterator[None]:
        """The global shards in place while evaluated; every unit resharded on both sides (the root keeps what an
        evaluation gathered, which the next step would otherwise compute with)."""
        self.within.reshard()
        with self.diloco.global_model():
            try:
                yield
            finally:
                self.within.reshard()

    def stats(self) -> IterationStats:
        """The node's reduce-scatters and the rounds that landed, since the last call."""
        node, rounds = self.within.stats(), super().stats()
        return IterationStats(comm_s=node.comm_s, exposed_s=node.exposed_s + rounds.exposed_s,
                              bytes_sent=node.bytes_sent + rounds.bytes_sent)

    def model_state(self, model: nn.Module) -> dict:
        return self.within.model_state(model)

    def optimizer_state(self) -> dict:
        return self.within.optimizer_state()

    def sharded_state(self, model: nn.Module) -> dict:
        return self.within.sharded_state(model)

    def load_sharded_state(self, model: nn.Module, folder) -> None:
        self.within.load_sharded_state(model, folder)

    def state_dict(self) -> dict:
        """Each rank's own, beside its layout: the round's state, its local shards and its inner optimizer's state
        (nodes differ between synchronisations; the sharded checkpoint keeps one node's)."""
        inner = [[t.clone() for t in local(list(self.optimizer.state[p].values()))] for p in self._stepped()]
        own = {"layout": self._layout, "periodic": self.diloco.state_dict(),
               "local": [p.detach().clone() for p in self.diloco.params], "inner": inner}
        return {"optimizer": None, "codec": own, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """This rank's own where it holds the same shards; otherwise the global shards start from the loaded ones
        (the outer momentum and the codec's state afresh)."""
        own = state.get("codec")
        if own and own.get("layout") == self._layout:
            self.diloco.load_state_dict(own["periodic"])
            with torch.no_grad():
                for p, saved in zip(self.diloco.params, own["local"]):
                    p.copy_(saved)
                for p, saved in zip(self._stepped(), own["inner"]):
                    torch._foreach_copy_(local(list(self.optimizer.state[p].values())), saved)
        else:
            self.diloco.restart()

    def _stepped(self) -> list[nn.Parameter]:
        """The inner optimizer's parameters with state, in its order."""
        return [p for group in self.optimizer.param_groups for p in group["params"] if self.optimizer.state[p]]

    def close(self) -> None:
        super().close()
        self.within.close()
