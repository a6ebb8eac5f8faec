"""Sums of e5m2 payloads after Oyama et al. 2020: two-stage through the node hierarchy, or flat over all ranks.

Every addition on the wire is Oyama et al.'s saturating fp8 + fp8; every step is built from paired
send/receive (full duplex), and each element's result is computed on one rank and copied to the
others, so all ranks end with the same bytes.
"""

from __future__ import annotations

import torch

from scalesgd.comm.codecs.fp8 import kernels as fp8
from scalesgd.comm.wire.collectives import post, ring_allgather_steps, ring_allreduce_steps, ring_members
from scalesgd.comm.wire.pipeline import Steps, run_steps
from scalesgd.comm.wire.topology import TopologyGroups


def saturating_add_into(into: torch.Tensor, incoming: torch.Tensor) -> None:
    """`into` ← fp8(into + incoming) with saturation: the ring's combine step for fp8 bytes."""
    fp8.add_(into, incoming)


def flat_sum(h: torch.Tensor, group=None, scratch: torch.Tensor | None = None) -> int:
    """One ring allreduce of fp8 bytes over every rank of `group` (Oyama et al.'s ablation); in place.

    `scratch`: at least ⌈len(h) / ranks⌉ bytes to receive into (allocated when None).
    """
    return run_steps(flat_sum_steps(h, group, scratch))


def flat_sum_steps(h: torch.Tensor, group=None, scratch: torch.Tensor | None = None, tag: int = 0) -> Steps:
    """`flat_sum` as steps (see `pipeline.Steps`)."""
    return ring_allreduce_steps(h, group, buf=scratch, combine=saturating_add_into, tag=tag)


def first_sum_ranks(groups: TopologyGroups) -> int:
    """How many ranks' values the two-stage sum adds before it first rounds: encode with 57344 ÷ this.

    The P′ ranks of a node; with one rank per node the node stage is skipped, so the ÷nodes it would apply
    folds into the encoding (one rounding fewer, and one pass over the bucket saved) and this is every rank.
    """
    local = groups.topology.procs_per_node
    return local if local > 1 else groups.topology.num_nodes


def scratch_size(n: int, groups: TopologyGroups) -> int:
    """Bytes of scratch `two_stage_sum` needs for n elements (pass it to avoid allocating each call)."""
    local = groups.topology.procs_per_node
    width = -(-n // local)
    return _node_rows(width, local) + width


def _node_rows(width: int, local: int) -> int:
    """Scratch for the node stage's received rows: P′ of `width` bytes, none when it is skipped (P′ = 1)."""
    return width * local if local > 1 else 0


def two_stage_sum(h: torch.Tensor, groups: TopologyGroups, scratch: torch.Tensor | None = None) -> int:
    """Sum fp8 bytes `h` in place: in the node, across nodes, back in the node; returns bytes sent.

    1. `h` is cut into P′ equal parts (zero-padded) and exchanged all-to-all in the node; each rank
       decodes the P′ copies of its part, sums them in float32, divides by the number of nodes and
       encodes once.
    2. That part is ring-allreduced with the ranks of equal local rank on the other nodes.
    3. The parts are allgathered in the node.
    Scaled as Oyama et al. do (÷P′ before encoding, ÷nodes here), the result is the mean over ranks; with
    one rank per node step 1 is skipped and the input must be scaled ÷nodes (see `first_sum_ranks`).
    `scratch`: at least `scratch_size(len(h), groups)` bytes to work in (allocated when None).
    """
    return run_steps(two_stage_steps(h, groups, scratch))


def two_stage_steps(h: torch.Tensor, groups: TopologyGroups, scratch: torch.Tensor | None = None,
                    tag: int = 0) -> Steps:
    """`two_stage_sum` as steps (see `pipeline.Steps`)."""
    node_rank, node_peers = ring_members(groups.node_group)
    local = len(node_peers)
    n = h.numel()
    width = -(-n // local)
    padded = h if width * local == n else torch.cat([h, h.new_zeros(width * local - n)])
    parts = padded.view(local, width)
    if scratch is None:
        scratch = h.new_empty(scratch_size(n, groups))
    rows = _node_rows(width, local)
    sent = 0
    if local > 1:  # alone in its node, a rank's bytes were scaled for the cross-node sum already
        received = scratch[:rows].view(local, width)  # row j: our part as local rank j encoded it
        received[node_rank] = parts[node_rank]
        for step in range(1, local):
            dst, src = (node_rank + step) % local, (node_rank - step) % local
            works, nbytes = post(groups.node_group, parts[dst], node_peers[dst], received[src], node_peers[src], tag)
            yield works
            sent += nbytes
        fp8.sum_rows(received, 1.0 / groups.topology.num_nodes, out=parts[node_rank])
    sent += yield from ring_allreduce_steps(parts[node_rank], groups.cross_group, buf=scratch[rows:],
                                            combine=saturating_add_into, tag=tag)
    sent += yield from ring_allgather_steps(list(parts), node_rank, node_peers, groups.node_group, tag)
    if padded is not h:
        h.copy_(padded[:n])
    return sent
