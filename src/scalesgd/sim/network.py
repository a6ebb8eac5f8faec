"""What each collective costs on a cluster, in the α–β model, step by step as our collectives run them.

Ranks are laid out node by node. A step that crosses nodes while every process of a node does the
same shares that node's link P′ ways; a ring uses each node's link once each way per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalesgd.comm.cost.link import LinkCost

SPARSE_ENTRY_BYTES = {"plain": 8, "compact": 4}  # an int32 index and an fp32 value; compact: 16 bits of each
GOYAL_HIERARCHICAL = "hierarchical_hd"  # simulated only: halving/doubling across servers (Goyal et al. 2017)


@dataclass(frozen=True)
class Cluster:
    """`nodes` × `procs_per_node` workers; `intra` joins processes of a node, `inter` each node to the others."""

    nodes: int
    procs_per_node: int
    inter: LinkCost
    intra: LinkCost

    @property
    def workers(self) -> int:
        return self.nodes * self.procs_per_node

    def with_nodes(self, nodes: int) -> Cluster:
        return Cluster(nodes, self.procs_per_node, self.inter, self.intra)

    @property
    def ring_link(self) -> LinkCost:
        """The slowest link a ring over every worker crosses."""
        return self.inter if self.nodes > 1 else self.intra


def ring_allreduce(nbytes: float, ranks: int, link: LinkCost, share: int = 1) -> float:
    """Reduce-scatter then allgather around a ring: 2(p−1) steps of nbytes/p (each link shared `share` ways)."""
    return 2 * reduce_scatter(nbytes, ranks, link, share)


def reduce_scatter(nbytes: float, ranks: int, link: LinkCost, share: int = 1) -> float:
    """p−1 steps of nbytes/p; the allgather that mirrors it costs the same."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) * link.seconds(nbytes / ranks * share)


def halving_doubling(nbytes: float, cluster: Cluster) -> float:
    """Recursive halving then doubling: the farthest partner first with half the vector (+2 full steps to fold)."""
    p = cluster.workers
    if p <= 1:
        return 0.0
    p2 = 1 << (p.bit_length() - 1)
    total, d, part = 0.0, p2 // 2, nbytes / 2
    while d:
        crosses = d >= cluster.procs_per_node and cluster.nodes > 1
        link, share = (cluster.inter, cluster.procs_per_node) if crosses else (cluster.intra, 1)
        total += 2 * link.seconds(part * share)  # once halving, once doubling
        d, part = d // 2, part / 2
    if p != p2:  # the folded ranks hand their vector in and get the result back
        total += 2 * cluster.ring_link.seconds(nbytes)
    return total


def hierarchical(nbytes: float, cluster: Cluster, across: str = "ring") -> float:
    """Reduce-scatter in the node, an allreduce across nodes per local rank (P′ of them share a node's link:
    a ring, or Goyal et al.'s halving/doubling), allgather in the node."""
    ppn, nodes = cluster.procs_per_node, cluster.nodes
    inside = 2 * reduce_scatter(nbytes, ppn, cluster.intra)
    if across == "halving_doubling":
        servers = Cluster(nodes, 1, LinkCost(cluster.inter.alpha_s, cluster.inter.bytes_per_s / ppn), cluster.inter)
        return inside + halving_doubling(nbytes / ppn, servers)
    return inside + ring_allreduce(nbytes / ppn, nodes, cluster.inter, share=ppn)


def dense_allreduce(nbytes: float, algorithm: str, cluster: Cluster) -> float:
    """Seconds for one allreduce of `nbytes` per rank with a registered algorithm (`native` is gloo's/NCCL's ring)."""
    if algorithm in ("ring", "native"):
        return ring_allreduce(nbytes, cluster.workers, cluster.ring_link)
    if algorithm == "halving_doubling":
        return halving_doubling(nbytes, cluster)
    if algorithm == "hierarchical":
        return hierarchical(nbytes, cluster)
    if algorithm == GOYAL_HIERARCHICAL:
        return hierarchical(nbytes, cluster, across="halving_doubling")
    raise ValueError(f"allreduce algorithm {algorithm!r} has no cost model")


def sparse_allgather(entries: float, ranks: int, link: LinkCost, share: int = 1, wire: str = "compact",
                     entry_bytes: float = 0.0) -> float:
    """Counts first, then p−1 ring steps each passing one rank's entries: plain, its indices and values (two
    messages); compact, one message of 4 bytes an entry; another wire, one message of `entry_bytes` an entry."""
    if ranks <= 1:
        return 0.0
    counts = math.ceil(math.log2(ranks)) * link.alpha_s
    messages = 2 if wire == "plain" else 1
    nbytes = entries * (entry_bytes or SPARSE_ENTRY_BYTES[wire]) * share
    return counts + (ranks - 1) * link.seconds(nbytes, messages=messages)


def node_sparse(numel: float, density: float, cluster: Cluster, wire: str = "compact") -> float:
    """topk-nodes: a dense fp32 reduce-scatter and allgather in the node, each shard's top-k across nodes."""
    ppn = cluster.procs_per_node
    inside = 2 * reduce_scatter(4 * numel, ppn, cluster.intra)
    return inside + sparse_allgather(math.ceil(density * numel / ppn), cluster.nodes, cluster.inter, share=ppn,
                                     wire=wire)
