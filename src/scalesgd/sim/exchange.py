"""One mode's predicted iteration on a cluster: its buckets, what each costs on the wire and in the codec,
and the compute its work displaces where it shares the cores, all through `comm.timing`'s one model."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from scalesgd.comm.codecs import CODECS
from scalesgd.comm.codecs.registry import LowRankCost
from scalesgd.comm.cost.planner import PLANNERS
from scalesgd.comm.cost.timing import timeline
from scalesgd.comm.engine.buckets import TensorInfo, ddp_buckets, plan_buckets
from scalesgd.sim import network
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.modes import SHARDED, Mode
from scalesgd.sim.sharded import check_sharded, predict_sharded
from scalesgd.sim.wire import cost_of, sent_sizes, wire_time

FIXED_POINT_ROUNDS = 6  # displaced compute ↔ overlap: converges in a few


@dataclass(frozen=True)
class Costs:
    """What a mode costs besides the wire: measured by a calibration, or assumed for another device."""

    channel_s_per_element: float = 0.0  # codec work on the exchange's channel (encode, decode, sums)
    inline_s_per_element: float = 0.0  # work on backward's own path (top-k selection)
    exchange_cpu_s: float = 0.0  # CPU per iteration the exchange takes where it shares cores with compute
    channel_s_per_bucket: float = 0.0  # a bucket's fixed cost beyond the wire's α (handing it over, codec calls)
    density_scale: float = 1.0  # a sparse codec's entries sent ÷ its nominal ⌈ρ·n⌉ (threshold reuse drifts)
    fsdp_backend: str = "nccl"  # how FSDP2's collectives run: beside compute (nccl), or in the issuing thread (gloo)

    def to_dict(self) -> dict:
        return {"channel_s_per_element": self.channel_s_per_element,
                "inline_s_per_element": self.inline_s_per_element, "exchange_cpu_s": self.exchange_cpu_s,
                "channel_s_per_bucket": self.channel_s_per_bucket, "density_scale": self.density_scale,
                "fsdp_backend": self.fsdp_backend}

    def channel(self, mode: Mode, cluster: network.Cluster):
        """Seconds on the channel for a bucket of n elements: the wire, then the codec's own work."""
        return lambda n: (wire_time(mode, n, cluster, self.density_scale) + self.channel_s_per_bucket
                          + self.channel_s_per_element * n) if n else 0.0

    def inline(self, n: int) -> float:
        """Seconds on backward's path for a bucket of n elements."""
        return self.inline_s_per_element * n


@dataclass(frozen=True)
class Prediction:
    """A mode's predicted iteration (seconds) and where its time went."""

    mode: str
    iteration_s: float
    exposed_comm_s: float
    compute_s: float  # forward and backward, the displaced share included
    groups: list[list[int]]  # the buckets it was predicted with, as layer groups (backward order)


def check_modelled(mode: Mode) -> None:
    """ValueError naming the modes the simulator knows, unless it knows `mode`."""
    if mode.engine == "none":
        return
    if mode.engine in SHARDED:
        return check_sharded(mode)
    if mode.codec not in CODECS or not CODECS[mode.codec].simulated:
        raise ValueError(f"mode {mode.name!r}: codec {mode.codec!r} has no cost model; the simulator knows "
                         f"{', '.join(c for c, e in CODECS.items() if e.simulated)}")
    if mode.engine == "ddp" and CODECS[mode.codec].torch_hook is None:
        known = [c for c, e in CODECS.items() if e.simulated and e.torch_hook is not None]
        raise ValueError(f"mode {mode.name!r}: under ddp the simulator knows PyTorch's own: {', '.join(known)}")


def nominal_sparse_bytes(mode: Mode, profile: ComputeProfile, workers: int) -> float:
    """Bytes a rank sends per iteration at the nominal density: ⌈ρ·n⌉ entries per bucket to each other rank."""
    cost = cost_of(mode)
    groups = grouping(mode, profile, lambda n: 0.0, lambda n: 0.0)
    entries = sum(math.ceil(cost.density * sum(profile.sizes[i] for i in g)) for g in groups)
    return (workers - 1) * entries * (cost.entry_bytes or network.SPARSE_ENTRY_BYTES[cost.entry_wire])


def grouping(mode: Mode, profile: ComputeProfile, channel, inline) -> list[list[int]]:
    """The mode's buckets as layer groups (backward order): DDP's, the codec's own rule, a plan, or the planner's."""
    tensors = [TensorInfo(n, s) for n, s in zip(profile.names, profile.sizes)]
    if mode.engine == "ddp":
        return [list(b) for b in ddp_buckets(tensors).buckets]
    spec = CODECS[mode.codec].buckets or mode.buckets
    if spec.startswith("planner:"):
        return PLANNERS[spec.split(":", 1)[1]](profile.t_f, list(profile.t_b), list(profile.sizes), channel, inline)
    return [list(b) for b in plan_buckets(spec, tensors).buckets]


def predict(mode: Mode, profile: ComputeProfile, cluster: network.Cluster, costs: Costs = Costs()) -> Prediction:
    """The mode's iteration: buckets ready as backward produces them, one channel in plan order, then the step.

    Where the exchange shares cores with compute, the part of its CPU (`costs.exchange_cpu_s`) spent
    while backward still runs slows backward by as much; that overlap depends on the slowed backward,
    so the two are solved together (a fixed point).
    """
    if mode.engine == "none" or cluster.workers == 1:
        return Prediction(mode.name, profile.iteration_s, 0.0, profile.accumulating_s + profile.compute_s, [])
    if mode.engine == "periodic":
        return periodic(mode, profile, cluster, costs)
    if mode.engine in SHARDED:
        iteration, exposed = predict_sharded(mode, profile, cluster, costs)
        return Prediction(mode.name, iteration, exposed, profile.accumulating_s + profile.compute_s, [])

    groups = grouping(mode, profile, costs.channel(mode, cluster), costs.inline)
    sizes = sent_sizes(mode, profile)
    if isinstance(cost_of(mode), LowRankCost):  # a low-rank mode's buckets are timed by what they send
        costs = replace(costs, channel_s_per_element=costs.channel_s_per_element * profile.numel / sum(sizes))
    channel, inline = costs.channel(mode, cluster), costs.inline
    backward = sum(profile.t_b)
    displaced, line = 0.0, None
    for _ in range(FIXED_POINT_ROUNDS):
        scale = 1 + displaced / backward if backward > 0 else 1.0
        line = timeline(groups, profile.t_f, [t * scale for t in profile.t_b], sizes, channel, inline)
        displaced = costs.exchange_cpu_s * (line.overlapped / line.busy if line.busy > 0 else 0.0)
    before = profile.accumulating_s  # micro-batches accumulated before the one whose backward exchanges
    return Prediction(mode.name, before + line.end + profile.t_step, line.exposed, before + line.backward_end, groups)


def periodic(mode: Mode, profile: ComputeProfile, cluster: network.Cluster, costs: Costs) -> Prediction:
    """A round of periodic synchronisation, per step: H steps of compute alone, and F fragments' exchanges (each
    1/F of the parameters through the codec, its wire and arithmetic), each hidden behind the τ steps it runs
    under; what is not hidden stalls the step it lands in."""
    schedule = mode.schedule
    numel = sum(profile.sizes) / schedule.fragments
    exchange = wire_time(mode, numel, cluster, costs.density_scale) + costs.channel_s_per_element * numel
    exposed = max(exchange - schedule.overlap_steps * profile.iteration_s, 0.0) / schedule.period
    return Prediction(mode.name, profile.iteration_s + exposed, exposed, profile.accumulating_s + profile.compute_s,
                      [])
