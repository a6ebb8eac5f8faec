"""The sums the sharded engine puts in FSDP2's gradient reduce-scatter: a cast's (`CodecReduceScatter`), any codec's
through its driver on each unit (`UnitSum`), and, where it shards within each node, the cross-node mean of each
unit's shard (`CrossNodeSum`)."""

from __future__ import annotations

import itertools
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # the documented `set_custom_reduce_scatter`'s

from scalesgd.comm.codecs import BucketView, Channel
from scalesgd.comm.engine.driver import BucketDriver, offsets_of
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


class CrossNodeSum:
    """The hybrid layout's mean across nodes of each unit's gradient shard, after the node's reduce-scatter averaged
    it (FSDP2's all-reduce hook, in place): every node holds the same shards, so a unit's shard is one bucket through
    the codec's driver, as a bucket of whole gradients is — fp8 relative to the shard's weights, top-k with this
    rank's residual of its shard, low rank of its rows, 1-bit Adam's momentum of its shard."""

    def __init__(self, driver: BucketDriver):
        self.driver = driver
        self.seconds, self.bytes_sent = 0.0, 0

    def hook(self, unit: int, params: list, keys: tuple[int, ...]):
        """The all-reduce hook of the `unit`-th sharded module, whose FSDP parameters are `params` (their codec state
        keyed by `keys`, their places in the model's parameters: the same in every run, whatever the world size)."""
        return lambda shard: self(shard, unit, params, keys)

    def __call__(self, shard: torch.Tensor, unit: int, params: list, keys: tuple[int, ...]) -> None:
        start = time.perf_counter()
        # each parameter's padded shard, laid out in `shard` as FSDP lays the reduce-scatter's output
        local = [p._sharded_param_data.view(p.padded_sharded_param_size) for p in params]
        self.bytes_sent += self.driver.exchange(shard, BucketView(unit, local, offsets_of(local), shard.numel(), keys))
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


class CodecReduceScatter(_CountedSum):
    """One FSDP module's gradient reduce-scatter on a cast codec's wire (fp32, fp16, bf16): cast, divided by the
    world size where FSDP asks for the mean (PyTorch's fp16 hook's order), summed; its time and bytes counted. On
    NCCL the sum is its own reduce-scatter; on gloo, whose reduce-scatter sends an allreduce's bytes, our ring's."""

    def __init__(self, codec):
        super().__init__()
        self.codec = codec

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        start = time.perf_counter()
        dtype = self.codec.wire_dtype or input_tensor.dtype
        wire = input_tensor.to(dtype)
        if dtype != input_tensor.dtype:
            self.codec.count_overflow(input_tensor, wire)
        if op == dist.ReduceOp.AVG:  # FSDP asks for the mean (fp32, bf16 reduce dtypes); gloo sums
            wire.div_(group.size())
        if wire.is_cuda:
            out = output_tensor if dtype == output_tensor.dtype else torch.empty_like(output_tensor, dtype=dtype)
            dist.reduce_scatter_single(output=out, input=wire, group=group, op=dist.ReduceOp.SUM)  # FSDP waits on none
        else:
            run_steps(ring_reduce_scatter_rows_steps(wire, group))
            out = wire.view(group.size(), -1)[dist.get_rank(group)]
        if out is not output_tensor:
            output_tensor.copy_(out)
        self.bytes_sent += wire.numel() * wire.element_size() * (group.size() - 1) // group.size()  # a ring's
        self.seconds += time.perf_counter() - start
        return None


class UnitSum(_CountedSum):
    """One unit's gradient reduce-scatter through a codec's driver. A codec whose sum can end in each rank's shard
    (`scatters`: the casts, fp8's saturating ring) takes the gradients as FSDP lays them, a row a rank, each
    parameter's part of a row one tensor (fp8 keeps a range for each, relative to the unit's gathered weights in the
    same layout, kept through backward for it). Any other takes the unit's whole gradients, parameter after parameter,
    as our engine's bucket of the same parameters: the same exchange (top-k's selection, low rank's matrices, 1-bit
    Adam's momenta), whose mean each rank keeps its shard of."""

    def __init__(self, driver: BucketDriver, unit: int, params: list, keys: tuple[int, ...]):
        super().__init__()
        self.driver, self.unit, self.params, self.keys = driver, unit, params, keys
        self.sizes = [p.padded_sharded_param_size.numel() for p in params]  # each one's part of a rank's row
        self.columns = list(itertools.accumulate(self.sizes[:-1], initial=0))

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        start = time.perf_counter()
        ranks, rank = self.driver.channel.world_size, dist.get_rank(self.driver.channel.group)
        rows = input_tensor.view(ranks, -1)
        if self.driver.channel.scatter:
            self.bytes_sent += self.driver.exchange(input_tensor, self._rows_view(rows, ranks))
            output_tensor.copy_(rows[rank])
        else:
            whole = [self._whole(rows, ranks, c, size, p) for c, size, p in zip(self.columns, self.sizes, self.params)]
            flat = torch.cat([g.reshape(-1) for g in whole])
            params = [p.unsharded_param.detach() for p in self.params] if self.driver.codec.reads_weights else whole
            view = BucketView(self.unit, params, offsets_of(whole), flat.numel(), self.keys)
            self.bytes_sent += self.driver.exchange(flat, view)  # the mean of the whole gradients
            for mean, c, size, p in zip(flat.split([g.numel() for g in whole]), self.columns, self.sizes, self.params):
                mine = mean.view(p._orig_size)[rank * p.padded_sharded_param_size[0]:][:p.padded_sharded_param_size[0]]
                shard = output_tensor[c:c + size].view(p.padded_sharded_param_size)
                shard[:mine.shape[0]].copy_(mine)
                shard[mine.shape[0]:].zero_()
        if op != dist.ReduceOp.AVG:  # FSDP divides after a sum
            output_tensor.mul_(ranks)
        self.seconds += time.perf_counter() - start
        return None

    def _rows_view(self, rows: torch.Tensor, ranks: int) -> BucketView:
        """The rows as the codec sees them: each parameter's part of each row one tensor (of the gathered weights
        where the codec reads them), keyed by parameter and row."""
        weights = (torch._chunk_cat([p.unsharded_param.detach() for p in self.params], dim=0, num_chunks=ranks)
                   if self.driver.codec.reads_weights else rows)
        parts = [weights[row, c:c + size].view(p.padded_sharded_param_size)  # a matrix's rows stay a matrix
                 for row in range(ranks) for c, size, p in zip(self.columns, self.sizes, self.params)]
        return BucketView(self.unit, parts, [row * rows.shape[1] + c for row in range(ranks) for c in self.columns],
                          rows.numel(), tuple(key * ranks + row for row in range(ranks) for key in self.keys))

    @staticmethod
    def _whole(rows: torch.Tensor, ranks: int, column: int, size: int, param) -> torch.Tensor:
        """A parameter's whole gradient from its padded parts of every rank's row."""
        padded = param.padded_sharded_param_size
        return rows[:, column:column + size].reshape(ranks * padded[0], *padded[1:])[:param._orig_size[0]]
