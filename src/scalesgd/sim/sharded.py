"""The sharded engine's iteration (FSDP2): each unit's parameters all-gathered before its forward and again before its
backward, its gradients summed after its backward — by the codec into each rank's shard, or (`--shard node`) in fp32
within the node and by the codec across nodes — all on one channel, in the order FSDP2 issues them.

On NCCL the collectives run beside compute (CUDA's streams): FSDP2 gathers one unit ahead and sums behind the next
unit's backward. On gloo (`Costs.fsdp_backend`) each runs in the thread that issued it, so a step is compute plus
every collective, and FSDP2's own reduce-scatter sends an allreduce's bytes (measured, torch 2.13; ours a ring's).
"""

from __future__ import annotations

from dataclasses import replace

from scalesgd.comm.codecs import CODECS
from scalesgd.comm.cost.link import LinkCost
from scalesgd.sim import network
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.modes import Mode
from scalesgd.sim.wire import cost_of, sent_sizes, wire_time

PARAMETER_BYTES = 4  # the all-gather carries fp32 shards (FSDP2's mixed precision casts them after)


def unit_groups(profile: ComputeProfile) -> tuple[list[list[int]], list[int]]:
    """Each unit's tensors (forward order) and the root's (what no unit holds: embeddings, head)."""
    if not profile.units:
        raise ValueError("a sharded mode is costed unit by unit, and this compute profile names no units; give "
                         "--model")
    units: list[list[int]] = [[] for _ in profile.units]
    root = []
    for i, name in enumerate(profile.names):
        owner = next((u for u, prefix in enumerate(profile.units) if name.startswith(prefix + ".")), None)
        (root if owner is None else units[owner]).append(i)
    return [u for u in units if u], root


def shards(mode: Mode, cluster: network.Cluster) -> int:
    """How many ranks share a model: every rank, or (`--shard node`) a node's."""
    return cluster.procs_per_node if mode.shard == "node" else cluster.workers


def gather_s(mode: Mode, numel: int, cluster: network.Cluster) -> float:
    """One unit's all-gather: a ring over the ranks sharing it, the mirror of an fp32 reduce-scatter."""
    link = cluster.intra if mode.shard == "node" or cluster.nodes == 1 else cluster.ring_link
    return network.reduce_scatter(PARAMETER_BYTES * numel, shards(mode, cluster), link)


def sum_s(mode: Mode, numel: int, cluster: network.Cluster, channel_s_per_element: float = 0.0,
          sent: float | None = None, backend: str = "nccl") -> float:
    """One unit's gradient sum of `numel` gradients, ending in each rank's shard (wire and the codec's own work);
    `sent`: what a low-rank codec puts on the wire for them (`sent_sizes`)."""
    sent = numel if sent is None else sent
    cost, entry = cost_of(mode), CODECS[mode.codec]
    work = channel_s_per_element * numel
    if mode.shard == "node":  # fp32 in the node, then each rank's shard across nodes, P′ of them on a node's link
        inside = network.reduce_scatter(PARAMETER_BYTES * numel, cluster.procs_per_node, cluster.intra)
        share = cluster.procs_per_node
        across = network.Cluster(cluster.nodes, 1, LinkCost(cluster.inter.alpha_s, cluster.inter.bytes_per_s / share),
                                 cluster.intra)
        if mode.engine == "fsdp2":  # FSDP2's own: an allreduce across nodes in its reduce dtype
            return inside + network.ring_allreduce(numel / share * cost.element_bytes, cluster.nodes, across.inter)
        return inside + wire_time(replace(mode, engine="scalesgd"), sent / share, across) + work / share
    if mode.engine == "fsdp2" and backend == "gloo":  # gloo's reduce-scatter: an allreduce, each keeping its part
        return network.ring_allreduce(numel * cost.element_bytes, cluster.workers, cluster.ring_link)
    if mode.engine == "fsdp2" or entry.scatters:  # a reduce-scatter on the codec's wire (NCCL's, or our ring)
        flags = network.ring_allreduce(entry.flag_bytes, cluster.workers, cluster.ring_link) if entry.flag_bytes else 0
        return network.reduce_scatter(numel * cost.element_bytes, cluster.workers, cluster.ring_link) + flags + work
    return wire_time(replace(mode, engine="scalesgd"), sent, cluster) + work  # whole gradients; each keeps its shard


def predict_sharded(mode: Mode, profile: ComputeProfile, cluster: network.Cluster, costs) -> tuple[float, float]:
    """(iteration, exposed exchange) seconds of one sharded step: forward and backward unit by unit (every
    micro-batch gathers; only the last sums), then the step on the shards."""
    units, root = unit_groups(profile)

    def size(group: list[int]) -> int:
        return sum(profile.sizes[i] for i in group)

    def back(group: list[int]) -> float:
        return sum(profile.t_b[i] for i in group)

    total_b = sum(profile.t_b) or 1.0
    forward = [profile.t_f * back(u) / total_b for u in units]
    head = [i for i in root if i > min(units[0])] if units else []  # after the units (the head): first in backward
    sent = sent_sizes(mode, profile)

    def summed(group: list[int]) -> float:
        return sum_s(mode, size(group), cluster, costs.channel_s_per_element, sum(sent[i] for i in group),
                     costs.fsdp_backend) + costs.channel_s_per_bucket

    gathers, sums, root_sum = [gather_s(mode, size(u), cluster) for u in units], list(map(summed, units)), summed(root)
    overlap, order = costs.fsdp_backend == "nccl", list(reversed(range(len(units))))

    def micro_batch(sums: list[float], root_sum: float) -> float:
        """Forward and backward of one micro-batch, its units' sums given (none while accumulating)."""
        ch = t = gather_s(mode, size(root), cluster)  # the root's parameters stay gathered through backward
        t += profile.t_f - sum(forward)  # the root's own forward (embeddings, head)
        ch, t = _units(gathers, forward, [0.0] * len(units), ch, t, overlap)
        t += back(head)
        ch, t = _units([gathers[u] for u in order], [back(units[u]) for u in order], [sums[u] for u in order], ch,
                       t, overlap)
        t += back(root) - back(head)  # the embeddings' backward, last
        return max(ch, t) + root_sum

    step = profile.t_step / shards(mode, cluster)
    end = (profile.accumulate - 1) * micro_batch([0.0] * len(units), 0.0) + micro_batch(sums, root_sum) + step
    return end, max(end - profile.accumulate * profile.compute_s - step, 0.0)


def _units(gathers: list[float], computes: list[float], sums: list[float], ch: float, t: float,
           overlap: bool) -> tuple[float, float]:
    """Units computed in turn (channel and compute free at `ch` and `t`): each after its all-gather, its sum after it.

    Where collectives run beside compute the next unit's gather is issued as this one's compute starts (FSDP2's
    prefetch) and the sum runs behind the next compute; else each collective holds the thread that issued it."""
    gathered = None
    for k, (compute, summed) in enumerate(zip(computes, sums)):
        if gathered is None:
            ch = gathered = max(ch, t) + gathers[k]
        begin = max(t, gathered)
        gathered = None
        if overlap and k + 1 < len(gathers):
            ch = gathered = max(ch, begin) + gathers[k + 1]
        t = begin + compute
        if summed:
            ch = max(ch, t) + summed
            t = t if overlap else ch
    return ch, t


def check_sharded(mode: Mode) -> None:
    """ValueError naming what the simulator costs on the mode's engine, unless it costs `mode`'s codec (a codec the
    engine does not run, `parse_mode` refuses)."""
    if not CODECS[mode.codec].simulated:
        takes = [c for c, e in CODECS.items() if e.runs_on(mode.engine) and e.simulated]
        raise ValueError(f"mode {mode.name!r}: under {mode.engine} the simulator costs {', '.join(takes)}")
