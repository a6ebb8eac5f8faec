"""What one bucket of a mode's gradients costs on the wire, as its codec's registration says it travels (α–β, as our
collectives step)."""

from __future__ import annotations

import math

from scalesgd.comm.codecs import CODECS
from scalesgd.comm.codecs.lowrank.factors import sent_elements
from scalesgd.comm.codecs.registry import Cost, LowRankCost, SparseCost
from scalesgd.sim import network
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.modes import Mode


def cost_of(mode: Mode) -> Cost:
    """What the mode's codec puts on the wire under its options, as its registration says."""
    return CODECS[mode.codec].cost(mode.options)


def wire_time(mode: Mode, numel: float, cluster: network.Cluster, density_scale: float = 1.0) -> float:
    """Seconds one bucket of `numel` gradients spends on the wire (α–β, as our collectives step); a sparse
    codec sends `density_scale` times its nominal entries. For a low-rank mode `numel` counts what it sends
    (`sent_sizes`), over its sums one after another."""
    if mode.engine == "none" or cluster.workers == 1 or numel == 0:
        return 0.0
    entry, cost = CODECS[mode.codec], cost_of(mode)
    algorithm = "native" if mode.engine == "ddp" else mode.algorithm
    if isinstance(cost, LowRankCost):
        return cost.sums * network.dense_allreduce(numel * cost.element_bytes / cost.sums, algorithm, cluster)
    if isinstance(cost, SparseCost):
        density = min(cost.density * density_scale, 1.0)
        if entry.needs_topology:  # topk-nodes: dense in the node, sparse across nodes
            return network.node_sparse(numel, density, cluster, cost.entry_wire)
        return network.sparse_allgather(math.ceil(density * numel), cluster.workers, cluster.ring_link,
                                        wire=cost.entry_wire, entry_bytes=cost.entry_bytes)
    nbytes = numel * cost.element_bytes
    if entry.needs_topology:  # fp8's two-stage sum: in the node, across nodes, back
        return network.hierarchical(nbytes, cluster)
    return network.dense_allreduce(nbytes, algorithm, cluster)


def sent_sizes(mode: Mode, profile: ComputeProfile) -> tuple[float, ...]:
    """What each tensor puts on the wire a step, in numbers: its size, or a low-rank mode's factors of it."""
    cost = cost_of(mode) if mode.engine != "none" else None
    if not isinstance(cost, LowRankCost):
        return profile.sizes
    if len(profile.shapes) != len(profile.sizes):
        raise ValueError(f"mode {mode.name!r}: a low-rank exchange is costed by its tensors' shapes, which this "
                         "compute profile lacks; measure it again")
    return tuple(sent_elements(shape, cost.rank, cost.min_rate, alternate=cost.sums == 1) for shape in profile.shapes)
