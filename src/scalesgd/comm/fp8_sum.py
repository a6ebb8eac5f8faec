"""Sums of e5m2 payloads (SPEC §2): two-stage through the node hierarchy, or flat over all ranks.

Every addition on the wire is the seed's saturating fp8 + fp8; every step is built from paired
send/receive (full duplex), and each element's result is computed on one rank and copied to the
others, so all ranks end with the same bytes.
"""

from __future__ import annotations

import torch

from scalesgd.comm import fp8
from scalesgd.comm.collectives import ring_allgather, ring_allreduce, ring_members, send_recv
from scalesgd.comm.topology import TopologyGroups


def saturating_add_into(into: torch.Tensor, incoming: torch.Tensor) -> None:
    """`into` ← fp8(into + incoming) with saturation: the ring's combine step for fp8 bytes."""
    fp8.add_(into, incoming)


def flat_sum(h: torch.Tensor, group=None, scratch: torch.Tensor | None = None) -> int:
    """One ring allreduce of fp8 bytes over every rank of `group` (the seed's ablation); in place.

    `scratch`: at least ⌈len(h) / ranks⌉ bytes to receive into (allocated when None).
    """
    return ring_allreduce(h, group, buf=scratch, combine=saturating_add_into)


def scratch_size(n: int, groups: TopologyGroups) -> int:
    """Bytes of scratch `two_stage_sum` needs for n elements (pass it to avoid allocating each call)."""
    width = -(-n // groups.topology.procs_per_node)
    return width * groups.topology.procs_per_node + width


def two_stage_sum(h: torch.Tensor, groups: TopologyGroups, scratch: torch.Tensor | None = None) -> int:
    """Sum fp8 bytes `h` in place: in the node, across nodes, back in the node; returns bytes sent.

    1. `h` is cut into P′ equal parts (zero-padded) and exchanged all-to-all in the node; each rank
       decodes the P′ copies of its part, sums them in float32, divides by the number of nodes and
       encodes once.
    2. That part is ring-allreduced with the ranks of equal local rank on the other nodes.
    3. The parts are allgathered in the node.
    Scaled as the seed does (÷P′ before encoding, ÷nodes here), the result is the mean over ranks.
    `scratch`: at least `scratch_size(len(h), groups)` bytes to work in (allocated when None).
    """
    node_rank, node_peers = ring_members(groups.node_group)
    local = len(node_peers)
    n = h.numel()
    width = -(-n // local)
    padded = h if width * local == n else torch.cat([h, h.new_zeros(width * local - n)])
    parts = padded.view(local, width)
    if scratch is None:
        scratch = h.new_empty(scratch_size(n, groups))
    received = scratch[:width * local].view(local, width)  # row j: our part as local rank j encoded it
    received[node_rank] = parts[node_rank]
    sent = 0
    for step in range(1, local):
        dst, src = (node_rank + step) % local, (node_rank - step) % local
        sent += send_recv(groups.node_group, parts[dst], node_peers[dst], received[src], node_peers[src])
    fp8.sum_rows(received, 1.0 / groups.topology.num_nodes, out=parts[node_rank])
    sent += ring_allreduce(parts[node_rank], groups.cross_group, buf=scratch[width * local:],
                           combine=saturating_add_into)
    sent += ring_allgather(list(parts), node_rank, node_peers, groups.node_group)
    if padded is not h:
        h.copy_(padded[:n])
    return sent
