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

from scalesgd.comm.codecs.base import BucketView, Channel, Exchange, Piece, Scratch
from scalesgd.comm.codecs.state import Held, keys_of
from scalesgd.comm.codecs.topk.codec import TopkCodec
from scalesgd.comm.wire.pipeline import Steps
from scalesgd.comm.wire.sparse import allgather_sparse_steps, mean_of_sparse


class NodeTopkCodec(TopkCodec):
    """`TopkCodec` on this rank's shard of its node's dense sum, exchanged with the same shard's owners on other
    nodes. Every collective runs in the transfer, on the engine's communication thread."""

    encode_in_backward = False  # the selection needs the node sum, a collective
    cross_node_bytes = 0  # what the last bucket's sparse step sent between nodes

    def start(self, flat: torch.Tensor, bucket: BucketView, channel: Channel, scratch: Scratch) -> Exchange:
        return NodeTopkExchange(self, flat, bucket, channel)

    def _held_before(self, bucket: BucketView, flat: torch.Tensor) -> Held | None:
        """This rank's shard of the bucket, kept under the bucket's keys (None before its first step: its size comes
        with the node groups, in the transfer)."""
        return self._flat.find(keys_of(bucket))


class NodeTopkExchange(Exchange):
    """One piece: the node's dense sum, this rank's shard sparsified and summed across nodes, the shards gathered
    back in the node."""

    def __init__(self, codec: NodeTopkCodec, flat: torch.Tensor, bucket: BucketView, channel: Channel):
        self.codec, self.flat, self.bucket, self.groups = codec, flat, bucket, channel.topology
        self.ranks = channel.world_size
        self.bounds = [(0, flat.numel())]

    def transfer(self, piece: Piece) -> Steps:
        flat, groups, topology = self.flat, self.groups, self.groups.topology
        node_bytes = _ring_bytes(flat, topology.procs_per_node)
        yield [dist.all_reduce(flat, group=groups.node_group, async_op=True)]
        size = math.ceil(flat.numel() / topology.procs_per_node)
        start = min(topology.local_rank * size, flat.numel())
        shard = flat[start:min(start + size, flat.numel())]
        if shard.numel() == 0:  # a bucket smaller than the node's ranks: this rank owns none of it
            idx, values, not_finite = shard.new_empty(0, dtype=torch.int32), shard.new_empty(0), False
        else:
            view = BucketView(self.bucket.index, [], [], shard.numel(), keys_of(self.bucket))
            idx, values, not_finite = self.codec.sparsify(shard, view, self.ranks)
        gathered = yield from allgather_sparse_steps(idx, values, groups.cross_group, not_finite, piece.tag,
                                                     self.codec.wire, shard.numel())
        self.codec.cross_node_bytes = gathered.sent
        mine = flat.new_zeros(size)
        if gathered.flagged:
            mine[:shard.numel()].fill_(math.nan)  # some rank's gradient was not finite: every rank sees it
        else:
            mean_of_sparse(mine[:shard.numel()], gathered.indices, gathered.values)  # ÷ nodes: the mean of the sums
            mine.div_(topology.procs_per_node)
        pieces = [torch.empty_like(mine) for _ in range(topology.procs_per_node)]
        yield [dist.all_gather(pieces, mine, group=groups.node_group, async_op=True)]
        if any(piece.numel() and not torch.isfinite(piece[:1]).all() for piece in pieces):
            flat.fill_(math.nan)  # a shard was flagged (all of it NaN): the whole bucket, as every codec does
        else:
            flat.copy_(torch.cat(pieces)[:flat.numel()])
        return gathered.sent + 2 * node_bytes  # the node sum, and the gather of the shards


def _ring_bytes(flat: torch.Tensor, ranks: int) -> int:
    """What a ring allreduce of `flat` sends from one of `ranks` ranks."""
    return 2 * (ranks - 1) * flat.numel() * flat.element_size() // ranks
