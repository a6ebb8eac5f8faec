"""fp8 (e5m2) exchange as SPEC §2: relative data, a per-tensor quantile range, a two-stage sum; with the
guardrails a user needs: ranges that are never stale zeros, headroom, non-finite gradients kept visible,
saturation counted, and a tensor whose saturation stays high sent dense."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from scalesgd.comm import fp8
from scalesgd.comm.codecs.base import BucketView, Channel, Codec
from scalesgd.comm.codecs.fp8_range import Fp8Options, TensorRange, sample_quantiles
from scalesgd.comm.fp8_sum import flat_sum, scratch_size, two_stage_sum
from scalesgd.comm.topology import TopologyGroups


class Fp8Codec(Codec):
    """Gradients travel as one e5m2 byte each, then one byte flagging a non-finite bucket and one byte per
    tensor flagging saturation.

    `relative`: send D = g/(|w|+ε) and multiply |w|+ε back after (False: the gradient itself, the
    seed's "direct" ablation). `two_stage`: the node-hierarchical sum (False: one fp8 ring over all
    ranks, the seed's other ablation). Every `period` steps each tensor's range q is re-estimated
    from `samples` random elements and max-reduced over ranks; values are scaled so that headroom·q
    maps to 57344 ÷ P′ (two-stage) or ÷ P (flat), which keeps the sums in range. A range that
    measures 0 or non-finite is not a range: the tensor's exact max |D| stands in and it is measured
    again the next step. When some rank saturates more than `saturation_limit` of a tensor's elements
    for `saturation_window` steps in a row, that tensor's bucket is exchanged dense (fp32) from then on.

    Range state belongs to parameter tensors, not buckets, so it survives any regrouping (DDP
    rebuilds its buckets after the first iteration, also after a resume); tensors are numbered as
    `Codec.key` says.
    """

    def __init__(self, name: str = "fp8", relative: bool = True, two_stage: bool = True,
                 options: Fp8Options = Fp8Options(), seed: int = 0):
        if options.problems():
            raise ValueError("; ".join(f"fp8 {name} {getattr(options, name)}: {problem}"
                                       for name, problem in options.problems().items()))
        self.name, self.relative, self.two_stage, self.options = name, relative, two_stage, options
        self.needs_topology = two_stage
        self._tensors: dict[int, TensorRange] = {}
        self._scales: dict[int, tuple] = {}  # bucket → (ranges, unit, send)
        self._weights: dict[int, torch.Tensor] = {}
        self._wires: dict[int, torch.Tensor] = {}
        self._scratch: dict[int, torch.Tensor] = {}
        self._lengths: dict[int, int] = {}
        self._dense: dict[int, bool] = {}  # bucket → exchanged dense this step
        self._eps = torch.tensor(options.eps)
        self._rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self._seed = seed
        self._counts = torch.zeros(3, dtype=torch.float64)  # elements, saturated, flushed to zero
        self._notices: list[tuple[torch.Tensor, str]] = []
        fp8.kernel_mode()  # compile now, not inside the first exchange

    # ---- encode → communicate → decode -----------------------------------------------------------
    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        keys = [self.key(p) for p in bucket.params]
        ranges = [self._tensors.setdefault(key, TensorRange()) for key in keys]
        self._dense[bucket.index] = any(r.dense for r in ranges)
        if self._dense[bucket.index]:
            return flat.div_(channel.world_size)
        w = self._flat_weights(bucket, flat) if self.relative else None
        due = [j for j, r in enumerate(ranges) if r.due(self.options.period)]
        if due:
            self._measure(flat, w, bucket, [keys[j] for j in due], due, channel)
        for r in ranges:
            r.step += 1
        send = self._scale(bucket, ranges, flat.device, channel)[2]
        n = flat.numel()
        wire = self._wire(bucket.index, n, flat.device, channel, len(ranges))
        if w is None:
            fp8.encode(flat, send, out=wire[:n])
        else:
            fp8.encode_relative(flat, w, self._eps, send, out=wire[:n])
        wire[n] = torch.where(torch.isfinite(flat).all(), 0, fp8.ONE_CODE)
        self._flag_saturation(flat, w, send, wire, bucket)
        return wire

    def communicate(self, wire: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        if self._dense[bucket.index]:
            return channel.allreduce(wire)
        scratch = self._scratch[bucket.index]
        if self.two_stage:
            return two_stage_sum(wire, _groups(channel), scratch)
        return flat_sum(wire, channel.group, scratch)

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        if self._dense[bucket.index]:
            if wire.data_ptr() != out.data_ptr():
                out.copy_(wire)
            return
        n = out.numel()
        ranges, unit = self._scales[bucket.index][1:3]
        if self.relative:
            fp8.decode_relative(wire[:n], self._weights[bucket.index], self._eps, unit, out=out)
        else:
            fp8.decode(wire[:n], unit, out=out)
        flags = wire[n:n + 1 + len(ranges)].tolist()  # the same bytes on every rank after the sum
        if flags[0]:
            out.fill_(math.nan)  # some rank's gradient was not finite: every rank sees it
        for param, r, hot in zip(bucket.params, ranges, flags[1:]):
            r.hot = r.hot + 1 if hot else 0
            if r.hot >= self.options.saturation_window and not r.dense:
                r.dense = True
                self._notices.append((param, f"fp8 saturated above {self.options.saturation_limit:g} of its "
                                             f"elements on some rank for {r.hot} steps: its bucket is exchanged "
                                             f"dense from its step {r.step + 1}"))

    # ---- guardrails ------------------------------------------------------------------------------
    def _flag_saturation(self, flat: torch.Tensor, w: torch.Tensor | None, send: torch.Tensor, wire: torch.Tensor,
                         bucket: BucketView) -> None:
        """Count saturated (clipped) and flushed-to-zero elements; raise each tensor's flag byte when it clips
        more than the limit beyond the 1 − Q that its quantile lets through by design."""
        n = flat.numel()
        saturated = fp8.clipped(flat, send, w, self._eps).to(torch.float32)
        flushed = (((wire[:n] & fp8.MAGNITUDE) == 0) & (flat != 0)).sum()
        sizes = [p.numel() for p in bucket.params]
        per_tensor = torch.segment_reduce(saturated, "sum", lengths=torch.tensor(sizes, device=flat.device))
        fraction = per_tensor / torch.tensor(sizes, dtype=torch.float32, device=flat.device)
        limit = self.options.saturation_limit
        hot = fraction > limit + 1 - self.options.quantile if limit > 0 else torch.zeros_like(fraction, dtype=torch.bool)
        wire[n + 1:n + 1 + len(sizes)] = torch.where(hot, fp8.ONE_CODE, 0).to(torch.uint8)
        self._counts += torch.stack([torch.tensor(float(n)), saturated.sum().double().cpu(),
                                     flushed.double().cpu()])

    def counters(self) -> dict[str, float]:
        elements, saturated, flushed = self._counts.tolist()
        self._counts.zero_()
        if not elements:
            return {}
        return {"fp8_saturated": saturated / elements, "fp8_flushed": flushed / elements}

    def pop_notices(self) -> list[tuple[torch.Tensor, str]]:
        notices, self._notices = self._notices, []
        return notices

    # ---- buffers, the range, the scale -----------------------------------------------------------
    def _wire(self, index: int, n: int, device: torch.device, channel: Channel, tensors: int) -> torch.Tensor:
        """The bucket's bytes: data, the non-finite flag, a saturation flag per tensor, zero padding to P′
        equal parts; and the sum's scratch, both kept across steps."""
        length = n + 1 + tensors
        wire = self._wires.get(index)
        if wire is None or self._lengths[index] != length:
            if self.two_stage:
                groups = _groups(channel)
                local = groups.topology.procs_per_node
                wire = torch.zeros(-(-length // local) * local, dtype=torch.uint8, device=device)
                self._scratch[index] = torch.empty(scratch_size(length, groups), dtype=torch.uint8, device=device)
            else:
                wire = torch.zeros(length, dtype=torch.uint8, device=device)
                self._scratch[index] = torch.empty(-(-length // channel.world_size), dtype=torch.uint8,
                                                   device=device)
            self._wires[index], self._lengths[index] = wire, length
        return wire

    def _measure(self, g: torch.Tensor, w: torch.Tensor | None, bucket: BucketView, keys: list[int],
                 positions: list[int], channel: Channel) -> None:
        """Fresh ranges for the tensors at `positions`: each rank's sampled quantile and exact max |D|,
        max-reduced so every rank scales alike."""
        found = torch.empty(2 * len(positions))
        for i, (key, j) in enumerate(zip(keys, positions)):
            # samples drawn from (seed, rank, tensor, step) alone: a resumed run draws what it would have
            step = self._tensors[key].step
            gen = torch.Generator().manual_seed(hash((self._seed, self._rank, key, step)) & (2 ** 62 - 1))
            start, size = bucket.offsets[j], bucket.params[j].numel()
            found[2 * i] = sample_quantiles(g, w, [start], [size], self.options, gen)[0]
            d = g[start:start + size].abs() if w is None else g[start:start + size].abs() / (
                w[start:start + size].abs() + self.options.eps)
            found[2 * i + 1] = d.max().cpu() if size else 0.0
        found = torch.nan_to_num(found, nan=math.inf).to(g.device)  # a NaN must win the max everywhere
        dist.all_reduce(found, op=dist.ReduceOp.MAX, group=channel.group)
        values = found.tolist()
        for i, key in enumerate(keys):
            self._tensors[key].update(values[2 * i], values[2 * i + 1])

    def _scale(self, bucket: BucketView, ranges: list[TensorRange], device: torch.device,
               channel: Channel) -> tuple:
        """(ranges, per-element 57344/(headroom·q) for decode, that ÷ the ranks of the first sum for encode),
        rebuilt when a range changes."""
        signature = (device, *((id(r), r.q) for r in ranges))
        cached = self._scales.get(bucket.index)
        if cached is None or cached[0] != signature:
            spread = _groups(channel).topology.procs_per_node if self.two_stage else channel.world_size
            sizes = torch.tensor([p.numel() for p in bucket.params], device=device)
            top = torch.tensor([self.options.headroom * r.q for r in ranges], device=device)
            unit = torch.repeat_interleave(fp8.MAX / top, sizes)
            cached = self._scales[bucket.index] = (signature, list(ranges), unit, unit / spread)
        return cached[1:]

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
        return {"tensors": {key: r.state_dict() for key, r in self._tensors.items()}}

    def load_state_dict(self, state: dict) -> None:
        self._tensors, self._scales = {}, {}
        for key, saved in state["tensors"].items():
            self._tensors[int(key)] = TensorRange.from_state(saved)


def _groups(channel: Channel):
    """The node and cross-node groups the two-stage sum runs in (the engine builds them at start-up)."""
    if not isinstance(channel.topology, TopologyGroups):
        raise ValueError("the two-stage fp8 sum needs the node groups: pass topology=TopologyGroups "
                         "(DistributedOptimizer builds them when its codec asks)")
    return channel.topology
