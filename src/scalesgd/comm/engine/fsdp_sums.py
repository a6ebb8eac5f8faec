"""The sums the sharded engine puts in FSDP2's gradient reduce-scatter, one per kind of codec as its registration says
(`sum_for`): a cast's (`CastSum`), a codec whose sum ends in each rank's shard (`RowsSum`), any other codec's on each
unit's whole gradients (`WholeSum`); and, where it shards within each node, the cross-node mean of each unit's shard
(`CrossNodeSum`). FSDP2's own objects are read through `fsdp_units`."""

from __future__ import annotations

import itertools
import time
from abc import abstractmethod

import torch
import torch.distributed as dist

from scalesgd.comm.codecs import BucketView, Channel, CodecEntry
from scalesgd.comm.engine.driver import BucketDriver, offsets_of
from scalesgd.comm.engine.fsdp_units import ReduceScatter, Unit
from scalesgd.comm.wire.collectives import ring_reduce_scatter_rows_steps
from scalesgd.comm.wire.groups import own_group
from scalesgd.comm.wire.pipeline import run_steps
from scalesgd.comm.wire.topology import Topology, TopologyGroups


class _CountedSum(ReduceScatter):
    """A reduce-scatter FSDP calls with its own buffers, counting its seconds and the bytes it sent."""

    def __init__(self):
        self.seconds, self.bytes_sent = 0.0, 0

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class CastSum(_CountedSum):
    """Every unit's gradient reduce-scatter on a cast codec's wire (fp32, fp16, bf16): cast, divided by the world
    size where FSDP asks for the mean (PyTorch's fp16 hook's order), summed; its time and bytes counted. On NCCL the
    sum is its own reduce-scatter; on gloo, whose reduce-scatter sends an allreduce's bytes, our ring's."""

    def __init__(self, codec, dtype: torch.dtype):
        super().__init__()
        self.codec, self.dtype = codec, dtype

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        start = time.perf_counter()
        wire = input_tensor.to(self.dtype)
        count = getattr(self.codec, "count_overflow", None)  # a cast that counts what its dtype cannot hold
        if self.dtype != input_tensor.dtype and count is not None:
            count(input_tensor, wire)
        if op == dist.ReduceOp.AVG:  # FSDP asks for the mean (fp32, bf16 reduce dtypes); gloo sums
            wire.div_(group.size())
        if wire.is_cuda:
            out = output_tensor if self.dtype == output_tensor.dtype else torch.empty_like(output_tensor,
                                                                                         dtype=self.dtype)
            dist.reduce_scatter_single(output=out, input=wire, group=group, op=dist.ReduceOp.SUM)  # FSDP waits on none
        else:
            run_steps(ring_reduce_scatter_rows_steps(wire, group))
            out = wire.view(group.size(), -1)[dist.get_rank(group)]
        if out is not output_tensor:
            output_tensor.copy_(out)
        self.bytes_sent += wire.numel() * wire.element_size() * (group.size() - 1) // group.size()  # a ring's
        self.seconds += time.perf_counter() - start
        return None


class _UnitSum(_CountedSum):
    """One unit's gradient reduce-scatter through a codec's driver (`reads_weights`: the codec encodes relative to
    the unit's gathered weights, kept through backward for it)."""

    def __init__(self, driver: BucketDriver, unit: Unit, reads_weights: bool):
        super().__init__()
        self.driver, self.unit, self.reads_weights = driver, unit, reads_weights
        self.sizes = [p.padded.numel() for p in unit.params]  # each one's part of a rank's row
        self.columns = list(itertools.accumulate(self.sizes[:-1], initial=0))

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        start = time.perf_counter()
        ranks = self.driver.channel.world_size
        self.sum(output_tensor, input_tensor, ranks, dist.get_rank(self.driver.channel.group))
        if op != dist.ReduceOp.AVG:  # FSDP divides after a sum
            output_tensor.mul_(ranks)
        self.seconds += time.perf_counter() - start
        return None

    @abstractmethod
    def sum(self, output: torch.Tensor, flat: torch.Tensor, ranks: int, rank: int) -> None:
        """The mean of `flat` (the unit's gradients, a row per rank) into this rank's `output` row."""


class RowsSum(_UnitSum):
    """A codec whose sum can end in each rank's shard (`scatters`: the casts, fp8's saturating ring) takes the
    gradients as FSDP lays them, a row a rank, each parameter's part of a row one tensor (fp8 keeps a range for each,
    relative to the unit's gathered weights in the same layout)."""

    def sum(self, output: torch.Tensor, flat: torch.Tensor, ranks: int, rank: int) -> None:
        rows = flat.view(ranks, -1)
        weights = (torch._chunk_cat([p.gathered() for p in self.unit.params], dim=0, num_chunks=ranks)
                   if self.reads_weights else rows)
        parts = [weights[row, c:c + size].view(p.padded)  # a matrix's rows stay a matrix
                 for row in range(ranks) for c, size, p in zip(self.columns, self.sizes, self.unit.params)]
        offsets = [row * rows.shape[1] + c for row in range(ranks) for c in self.columns]
        view = BucketView(self.unit.index, parts, offsets, rows.numel(),
                          tuple(key * ranks + row for row in range(ranks) for key in self.unit.keys))
        self.bytes_sent += self.driver.exchange(flat, view)
        output.copy_(rows[rank])


class WholeSum(_UnitSum):
    """Any other codec takes the unit's whole gradients, parameter after parameter, as our engine's bucket of the same
    parameters: the same exchange (top-k's selection, low rank's matrices, 1-bit Adam's momenta), whose mean each rank
    keeps its shard of."""

    def sum(self, output: torch.Tensor, flat: torch.Tensor, ranks: int, rank: int) -> None:
        rows, params = flat.view(ranks, -1), self.unit.params
        whole = [self._whole(rows, ranks, c, size, p) for c, size, p in zip(self.columns, self.sizes, params)]
        joined = torch.cat([g.reshape(-1) for g in whole])
        read = [p.gathered() for p in params] if self.reads_weights else whole
        view = BucketView(self.unit.index, read, offsets_of(whole), joined.numel(), self.unit.keys)
        self.bytes_sent += self.driver.exchange(joined, view)  # the mean of the whole gradients
        for mean, c, size, p in zip(joined.split([g.numel() for g in whole]), self.columns, self.sizes, params):
            mine = mean.view(p.whole)[rank * p.rows:][:p.rows]
            shard = output[c:c + size].view(p.padded)
            shard[:mine.shape[0]].copy_(mine)
            shard[mine.shape[0]:].zero_()

    @staticmethod
    def _whole(rows: torch.Tensor, ranks: int, column: int, size: int, param) -> torch.Tensor:
        """A parameter's whole gradient from its padded parts of every rank's row."""
        return rows[:, column:column + size].reshape(ranks * param.rows, *param.padded[1:])[:param.whole[0]]


def sum_for(entry: CodecEntry) -> type[_UnitSum] | type[CastSum]:
    """The sum a codec runs in the sharded engine's reduce-scatter, as its registration says: a cast's, one ending in
    the shards, or one of the whole unit."""
    if entry.cast is not None:
        return CastSum
    return RowsSum if entry.scatters else WholeSum


class CrossNodeSum:
    """The hybrid layout's mean across nodes of each unit's gradient shard, after the node's reduce-scatter averaged
    it (FSDP2's all-reduce hook, in place): every node holds the same shards, so a unit's shard is one bucket through
    the codec's driver, as a bucket of whole gradients is — fp8 relative to the shard's weights, top-k with this
    rank's residual of its shard, low rank of its rows, 1-bit Adam's momentum of its shard."""

    def __init__(self, driver: BucketDriver):
        self.driver = driver
        self.seconds, self.bytes_sent = 0.0, 0

    def hook(self, unit: Unit):
        """The all-reduce hook of `unit`."""
        return lambda shard: self(shard, unit)

    def __call__(self, shard: torch.Tensor, unit: Unit) -> None:
        start = time.perf_counter()
        # each parameter's padded shard, laid out in `shard` as FSDP lays the reduce-scatter's output
        local = [p.shard() for p in unit.params]
        self.bytes_sent += self.driver.exchange(shard, BucketView(unit.index, local, offsets_of(local), shard.numel(),
                                                                  unit.keys))
        self.seconds += time.perf_counter() - start


def cross_node_channel(groups, two_stage: bool) -> Channel:
    """Where the cross-node sum travels: the ranks holding the same shards, one a node; a codec that sums in two
    stages (`two_stage`: its registration's `needs_topology`) finds each of them alone in its node (its node stage
    skipped)."""
    nodes = dist.get_world_size(groups.cross_group)
    topology = None
    if two_stage:  # a group of one for each rank (collective: every rank makes every one)
        alone = [own_group([rank]) for rank in range(dist.get_world_size())][dist.get_rank()]
        topology = TopologyGroups(Topology(nodes, dist.get_rank(groups.cross_group), 1), alone, groups.cross_group)
    return Channel(groups.cross_group, nodes, "ring", topology)
