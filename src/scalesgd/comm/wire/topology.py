"""Which ranks share a node, and the process groups a hierarchical allreduce runs in.

Ranks are laid out node by node, as torchrun numbers them: node n holds the global ranks
n·P′ … n·P′+P′−1, where P′ is the number of processes per node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

from scalesgd.comm.wire.groups import own_group


@dataclass(frozen=True)
class Topology:
    """This rank's place among `world_size` ranks spread evenly over nodes of `procs_per_node` each."""

    world_size: int
    rank: int
    procs_per_node: int

    def __post_init__(self):
        if self.world_size < 1 or self.procs_per_node < 1:
            raise ValueError(f"world_size ({self.world_size}) and procs_per_node ({self.procs_per_node}) "
                             "must be at least 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside the world of {self.world_size} ranks")
        if self.world_size % self.procs_per_node:
            raise ValueError(f"world size {self.world_size} is not divisible by procs_per_node "
                             f"{self.procs_per_node}: every node must run the same number of processes")

    @property
    def node(self) -> int:
        return self.rank // self.procs_per_node

    @property
    def local_rank(self) -> int:
        return self.rank % self.procs_per_node

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.procs_per_node

    def node_ranks(self, node: int | None = None) -> tuple[int, ...]:
        """Global ranks on `node` (default: this rank's node), in local-rank order."""
        node = self.node if node is None else node
        return tuple(range(node * self.procs_per_node, (node + 1) * self.procs_per_node))

    def cross_ranks(self, local_rank: int | None = None) -> tuple[int, ...]:
        """Global ranks holding `local_rank` (default: this rank's) on each node, in node order."""
        local_rank = self.local_rank if local_rank is None else local_rank
        return tuple(range(local_rank, self.world_size, self.procs_per_node))

    @classmethod
    def from_env(cls, procs_per_node: int | None = None) -> Topology:
        """The running job's topology: rank and size from torch.distributed, P′ from LOCAL_WORLD_SIZE.

        Without an initialised process group, RANK and WORLD_SIZE are read from the environment
        (default: a single rank). Without LOCAL_WORLD_SIZE, all ranks count as one node.
        """
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        if procs_per_node is None:
            procs_per_node = _env_int("LOCAL_WORLD_SIZE", world)
        return cls(world_size=world, rank=rank, procs_per_node=procs_per_node)

    def groups(self, backend: str | None = None) -> TopologyGroups:
        """This topology's groups, built once per default process group (collective on first call)."""
        key = (self, backend)
        world_pg = dist.group.WORLD
        cached = _GROUPS.get(key)
        if cached is None or cached[0] is not world_pg:
            cached = _GROUPS[key] = (world_pg, build_groups(self, backend))
        return cached[1]


@dataclass(frozen=True)
class TopologyGroups:
    """The intra-node group and the cross-node group (same local rank on every node) of one rank."""

    topology: Topology
    node_group: dist.ProcessGroup
    cross_group: dist.ProcessGroup


def build_groups(topology: Topology, backend: str | None = None) -> TopologyGroups:
    """Create every node group, then every cross-node group, on every rank in the same order.

    `dist.new_group` is collective over the default group, so every rank must call it for every
    group, including those it is not in; creating them all at once keeps the order identical.
    `backend` None means the default group's backend.
    """
    if dist.get_world_size() != topology.world_size or dist.get_rank() != topology.rank:
        raise ValueError(f"topology (rank {topology.rank} of {topology.world_size}) does not match the "
                         f"default process group (rank {dist.get_rank()} of {dist.get_world_size()})")
    node_group = cross_group = None
    for node in range(topology.num_nodes):
        g = own_group(list(topology.node_ranks(node)), backend=backend)
        if node == topology.node:
            node_group = g
    for local in range(topology.procs_per_node):
        g = own_group(list(topology.cross_ranks(local)), backend=backend)
        if local == topology.local_rank:
            cross_group = g
    return TopologyGroups(topology, node_group, cross_group)


_GROUPS: dict[tuple[Topology, str | None], tuple[object, TopologyGroups]] = {}


def _env_int(name: str, default: int) -> int:
    """An integer environment variable, `default` when unset or empty; a clear error when malformed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
