"""fp8 (e5m2) exchange as SPEC §2: relative data, a per-tensor quantile range, a two-stage sum."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalesgd import checks
from scalesgd.comm import fp8
from scalesgd.comm.codecs.base import BucketView, Channel, Codec
from scalesgd.comm.fp8_sum import flat_sum, scratch_size, two_stage_sum
from scalesgd.comm.topology import TopologyGroups

Q_FLOOR = 1e-30  # an all-zero tensor's range: keeps 57344/q finite


@dataclass(frozen=True)
class Fp8Options:
    """The seed's settings: ε of the relative data, the quantile Q, its period N and sample count R."""

    eps: float = 1e-5
    quantile: float = 0.95
    period: int = 100
    samples: int = 1024

    def problems(self) -> dict[str, str]:
        """Setting → what is wrong with it (empty when valid)."""
        return checks.problems(vars(self), {"eps": checks.positive,
                                            "quantile": checks.within(0, 1, low_open=True),
                                            "period": checks.at_least(1, "steps"),
                                            "samples": checks.at_least(1)})


class _TensorRange:
    """One parameter tensor's range q (max over ranks of its sampled quantile) and its step count."""

    def __init__(self):
        self.q: float | None = None
        self.step = 0


class Fp8Codec(Codec):
    """Gradients travel as one e5m2 byte each.

    `relative`: send D = g/(|w|+ε) and multiply |w|+ε back after (False: the gradient itself, the
    seed's "direct" ablation). `two_stage`: the node-hierarchical sum (False: one fp8 ring over all
    ranks, the seed's other ablation). Every `period` steps each tensor's range q is re-estimated
    from `samples` random elements and max-reduced over ranks; values are scaled so that q maps to
    57344 ÷ P′ (two-stage) or ÷ P (flat), which keeps the sums in range.

    Range state belongs to parameter tensors, not buckets, so it survives any regrouping (DDP
    rebuilds its buckets after the first iteration, also after a resume). Tensors are numbered in
    the order the codec first sees them, which the same run always repeats.
    """

    def __init__(self, name: str = "fp8", relative: bool = True, two_stage: bool = True,
                 options: Fp8Options = Fp8Options(), seed: int = 0):
        if options.problems():
            raise ValueError("; ".join(f"fp8 {name} {getattr(options, name)}: {problem}"
                                       for name, problem in options.problems().items()))
        self.name, self.relative, self.two_stage, self.options = name, relative, two_stage, options
        self.needs_topology = two_stage
        self._keys: dict[int, int] = {}  # id(parameter) → its number
        self._tensors: dict[int, _TensorRange] = {}
        self._scales: dict[int, tuple] = {}  # bucket → ((number, q) per tensor, unit, send)
        self._weights: dict[int, torch.Tensor] = {}
        self._wires: dict[int, torch.Tensor] = {}
        self._scratch: dict[int, torch.Tensor] = {}
        self._lengths: dict[int, int] = {}
        self._eps = torch.tensor(options.eps)
        self._rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self._seed = seed
        fp8.kernel_mode()  # compile now, not inside the first exchange

    # ---- encode → communicate → decode -----------------------------------------------------------
    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        keys = [self._keys.setdefault(id(p), len(self._keys)) for p in bucket.params]
        ranges = [self._tensors.setdefault(key, _TensorRange()) for key in keys]
        w = self._flat_weights(bucket, flat) if self.relative else None
        due = [j for j, r in enumerate(ranges) if r.q is None or r.step % self.options.period == 0]
        if due:
            for j, q in zip(due, self._measure(flat, w, bucket, [keys[j] for j in due], due, channel)):
                ranges[j].q = q
        for r in ranges:
            r.step += 1
        _, send = self._scale(bucket, keys, ranges, flat.device, channel)
        wire = self._wire(bucket.index, flat, channel)
        if w is None:
            fp8.encode(flat, send, out=wire[:flat.numel()])
        else:
            fp8.encode_relative(flat, w, self._eps, send, out=wire[:flat.numel()])
        return wire

    def communicate(self, wire: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        scratch = self._scratch[bucket.index]
        if self.two_stage:
            return two_stage_sum(wire, _groups(channel), scratch)
        return flat_sum(wire, channel.group, scratch)

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        unit, wire = self._scales[bucket.index][1], wire[:out.numel()]
        if self.relative:
            fp8.decode_relative(wire, self._weights[bucket.index], self._eps, unit, out=out)
        else:
            fp8.decode(wire, unit, out=out)

    def _wire(self, index: int, flat: torch.Tensor, channel: Channel) -> torch.Tensor:
        """The bucket's byte buffer (zero-padded to P′ equal parts) and the sum's scratch, kept across steps."""
        n = flat.numel()
        wire = self._wires.get(index)
        if wire is None or self._lengths[index] != n:
            if self.two_stage:
                groups = _groups(channel)
                local = groups.topology.procs_per_node
                wire = torch.zeros(-(-n // local) * local, dtype=torch.uint8, device=flat.device)
                self._scratch[index] = torch.empty(scratch_size(n, groups), dtype=torch.uint8, device=flat.device)
            else:
                wire = torch.empty(n, dtype=torch.uint8, device=flat.device)
                self._scratch[index] = torch.empty(-(-n // channel.world_size), dtype=torch.uint8,
                                                   device=flat.device)
            self._wires[index], self._lengths[index] = wire, n
        return wire

    # ---- the range -------------------------------------------------------------------------------
    def _measure(self, g: torch.Tensor, w: torch.Tensor | None, bucket: BucketView, keys: list[int],
                 positions: list[int], channel: Channel) -> list[float]:
        """Fresh ranges for the tensors at `positions` in the bucket, max-reduced so every rank scales alike."""
        q = torch.empty(len(positions))
        for i, (key, j) in enumerate(zip(keys, positions)):
            # samples drawn from (seed, rank, tensor, step) alone: a resumed run draws what it would have
            step = self._tensors[key].step
            gen = torch.Generator().manual_seed(hash((self._seed, self._rank, key, step)) & (2 ** 62 - 1))
            q[i] = sample_quantiles(g, w, [bucket.offsets[j]], [bucket.params[j].numel()], self.options, gen)[0]
        q = q.to(g.device)
        dist.all_reduce(q, op=dist.ReduceOp.MAX, group=channel.group)
        return q.tolist()

    def _scale(self, bucket: BucketView, keys: list[int], ranges: list[_TensorRange], device: torch.device,
               channel: Channel) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-element 57344/q (decode) and that ÷ the ranks of the first sum (encode), rebuilt when q changes."""
        signature = tuple((key, r.q) for key, r in zip(keys, ranges))
        cached = self._scales.get(bucket.index)
        if cached is None or cached[0] != signature or cached[1].device != device:
            spread = _groups(channel).topology.procs_per_node if self.two_stage else channel.world_size
            sizes = torch.tensor([p.numel() for p in bucket.params], device=device)
            unit = torch.repeat_interleave(fp8.MAX / torch.tensor([r.q for r in ranges], device=device), sizes)
            cached = self._scales[bucket.index] = (signature, unit, unit / spread)
        return cached[1], cached[2]

    def _flat_weights(self, bucket: BucketView, like: torch.Tensor) -> torch.Tensor:
        """The bucket's parameters as one flat float32 vector in the gradient buffer's layout (kept for decode)."""
        params = bucket.params
        if len(params) == 1 and params[0].dtype == torch.float32 and params[0].is_contiguous():
            flat = params[0].detach().view(-1)  # already flat: no copy
        else:
            flat = self._weights.get(bucket.index)
            if flat is None or flat.numel() != like.numel() or flat.data_ptr() == params[0].data_ptr():
                flat = torch.empty(like.numel(), dtype=torch.float32, device=like.device)
            torch.cat([p.detach().reshape(-1).float() for p in params], out=flat)
        self._weights[bucket.index] = flat
        return flat

    # ---- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"tensors": {key: {"q": r.q, "step": r.step} for key, r in self._tensors.items()}}

    def load_state_dict(self, state: dict) -> None:
        self._tensors, self._scales = {}, {}
        for key, saved in state["tensors"].items():
            r = self._tensors[int(key)] = _TensorRange()
            r.q, r.step = saved["q"], int(saved["step"])


def sample_quantiles(g: torch.Tensor, w: torch.Tensor | None, offsets: list[int], sizes: list[int],
                     options: Fp8Options, generator: torch.Generator) -> torch.Tensor:
    """Per tensor, the Q-quantile of |D| (D = g/(|w|+ε), or g without `w`) over R random elements.

    Tensors of at most R elements use all of them, so the estimate is exact there.
    """
    q = torch.empty(len(sizes))
    for i, (start, n) in enumerate(zip(offsets, sizes)):
        if n <= options.samples:
            idx = torch.arange(start, start + n, device=g.device)
        else:
            idx = torch.randint(n, (options.samples,), generator=generator).to(g.device) + start
        d = g[idx].float().abs()
        if w is not None:
            d = d / (w[idx].abs() + options.eps)
        q[i] = torch.quantile(d, options.quantile).cpu()
    return q.clamp_min(Q_FLOOR)


def _groups(channel: Channel):
    """The node and cross-node groups the two-stage sum runs in (the engine builds them at start-up)."""
    if not isinstance(channel.topology, TopologyGroups):
        raise ValueError("the two-stage fp8 sum needs the node groups: pass topology=TopologyGroups "
                         "(DistributedOptimizer builds them when its codec asks)")
    return channel.topology
