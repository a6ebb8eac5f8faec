"""Top-k across nodes only: inside a node the links are fast, so the bucket is summed there densely; only the
links between nodes carry (index, value) pairs, so their bytes grow with the nodes, not the processes.

Per bucket: (1) a dense allreduce in the node group gives every local rank the node's sum; (2) local rank l
owns shard l of it (⌈n/P′⌉ entries): it adds its residual, keeps the top ρ of the shard and exchanges them with
the ranks holding shard l on the other nodes (the cross-node group), as `TopkCodec` does over all ranks; (3) the
shards' means are gathered in the node group into the whole bucket. On N nodes each node sends ρ·n·(N − 1)
pairs across, whatever P′. Residuals are per node and shard. Local clipping, which is per tensor, does not apply.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from scalesgd.comm.codecs.base import BucketView, Channel
from scalesgd.comm.codecs.topk.codec import TopkCodec
from scalesgd.comm.wire.sparse import allgather_sparse, mean_of_sparse


class NodeTopkCodec(TopkCodec):
    """`TopkCodec` on this rank's shard of its node's dense sum, exchanged with the same shard's owners on other
    nodes. Every collective runs on the communication thread."""

    needs_topology = True
    encode_in_backward = False  # the node sum is a collective
    cross_node_bytes = 0  # what the last bucket's sparse step sent between nodes

    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        groups = channel.topology
        self._node_bytes = _ring_bytes(flat, groups.topology.procs_per_node)
        dist.all_reduce(flat, group=groups.node_group)
        shard = flat[_shard(flat.numel(), groups.topology)]
        if shard.numel() == 0:  # a bucket smaller than the node's ranks: this rank owns none of it
            self._sent[bucket.index] = (shard.new_empty(0, dtype=torch.int32), shard.new_empty(0), False)
            return shard
        return super().encode(shard, BucketView(bucket.index, [], [], shard.numel()), channel)

    def communicate(self, wire: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        idx, values, not_finite = self._sent[bucket.index]
        all_idx, all_val, sent, flagged = allgather_sparse(idx, values, channel.topology.cross_group, not_finite)
        self._sent[bucket.index] = (all_idx, all_val, flagged)
        self.cross_node_bytes = sent
        return sent + 2 * self._node_bytes  # the node sum, and the gather of the shards after decode

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        topology = channel.topology.topology
        size = math.ceil(out.numel() / topology.procs_per_node)
        mine = out.new_zeros(size)
        shard = mine[:wire.numel()]
        all_idx, all_val, flagged = self._sent.pop(bucket.index)
        if flagged:
            shard.fill_(math.nan)  # some rank's gradient was not finite: every rank sees it
        else:
            mean_of_sparse(shard, all_idx, all_val)  # ÷ nodes: the mean of the node sums
            shard.div_(topology.procs_per_node)
        pieces = [torch.empty_like(mine) for _ in range(topology.procs_per_node)]
        dist.all_gather(pieces, mine, group=channel.topology.node_group)
        out.copy_(torch.cat(pieces)[:out.numel()])


def _shard(numel: int, topology) -> slice:
    """Local rank l's part of a bucket of `numel` entries: the l-th run of ⌈numel/P′⌉."""
    size = math.ceil(numel / topology.procs_per_node)
    start = min(topology.local_rank * size, numel)
    return slice(start, min(start + size, numel))


def _ring_bytes(flat: torch.Tensor, ranks: int) -> int:
    """What a ring allreduce of `flat` sends from one of `ranks` ranks."""
    return 2 * (ranks - 1) * flat.numel() * flat.element_size() // ranks
