"""fp8 (e5m2) exchange as SPEC §2: relative data, a per-tensor quantile range, a two-stage sum; with the
guardrails a user needs: ranges that are never stale zeros, headroom, non-finite gradients kept visible,
saturation counted, and a tensor whose saturation stays high sent dense.

A bucket travels in pieces of `segment` elements, pipelined: while some pieces are on the wire, this process
encodes the next and decodes the summed ones, so the arithmetic hides behind the transfers (the seed's 3.21×
over fp32 needs it: run one after another, encode, sum and decode cost more than the bytes they save)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from scalesgd.comm.codecs.base import BucketView, Channel, Codec
from scalesgd.comm.codecs.fp8 import kernels as fp8
from scalesgd.comm.codecs.fp8.ranges import Fp8Options, TensorRange, sample_quantiles
from scalesgd.comm.codecs.fp8.sums import first_sum_ranks, flat_sum_steps, scratch_size, two_stage_steps
from scalesgd.comm.wire.pipeline import run_pipelined
from scalesgd.comm.wire.topology import TopologyGroups

SEGMENT = 1 << 22  # elements per pipelined piece: 4 MB of fp8, ~34 ms at 1 Gbit/s; a few compiled calls each
DEPTH = 3  # pieces in flight: the link carries two while this process encodes, adds or decodes a third
TAGS = 1024  # message tags cycled through by the pieces (far more than are ever in flight)


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

    `encode` fixes the scales; `communicate` encodes, sums and decodes the bucket `segment` elements at a
    time with up to `depth` pieces in flight, writing the mean into the buffer `encode` was given; `decode`
    applies the flags.
    """

    def __init__(self, name: str = "fp8", relative: bool = True, two_stage: bool = True,
                 options: Fp8Options = Fp8Options(), seed: int = 0, segment: int = SEGMENT, depth: int = DEPTH):
        if options.problems():
            raise ValueError("; ".join(f"fp8 {name} {getattr(options, name)}: {problem}"
                                       for name, problem in options.problems().items()))
        if segment < 1 or depth < 1:
            raise ValueError(f"fp8 segment {segment} and depth {depth}: give at least 1 each")
        self.name, self.relative, self.two_stage, self.options = name, relative, two_stage, options
        self.segment, self.depth = segment, depth
        self.needs_topology = two_stage
        self._tensors: dict[int, TensorRange] = {}
        self._scales: dict[int, tuple] = {}  # bucket → (ranges, unit, send)
        self._weights: dict[int, torch.Tensor] = {}
        self._wires: dict[int, torch.Tensor] = {}
        self._scratch: dict[int, list[torch.Tensor]] = {}  # bucket → a sum's scratch per piece in flight
        self._lengths: dict[int, int] = {}
        self._dense: dict[int, bool] = {}  # bucket → exchanged dense this step
        self._pending: dict[int, tuple] = {}  # bucket → (gradient, weights, decode and encode scales) until sent
        self._means: dict[int, torch.Tensor] = {}  # bucket → the buffer `communicate` decoded into
        self._eps = torch.tensor(options.eps)
        self._seed = seed
        self._elements = 0
        self._saturated = 0
        self._flushed: torch.Tensor | None = None  # on the gradients' device: read when the counters are
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
        unit, send = self._scale(bucket, ranges, flat.device, channel)[1:]
        self._pending[bucket.index] = (flat, w, unit, send)
        return self._wire(bucket.index, flat.numel(), flat.device, channel, len(ranges))

    def communicate(self, wire: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        if self._dense[bucket.index]:
            return channel.allreduce(wire)
        flat, w, unit, send = self._pending.pop(bucket.index)
        n, index = flat.numel(), bucket.index
        flushed = torch.zeros((), dtype=torch.int64, device=flat.device)
        clipped = [0] * len(bucket.params)  # per tensor
        nonfinite = [False]

        def piece(i: int, a: int, b: int):
            stop = min(b, n)
            if a < stop:
                most, zeroed = fp8.encode_stats(flat[a:stop], wire[a:stop], send[a:stop],
                                                None if w is None else w[a:stop], self._eps)
                flushed.add_(zeroed)
                if not most.item() <= fp8.MAX:  # something clipped or is not finite: look closer (rare)
                    nonfinite[0] |= self._tally(flat, w, send, bucket, a, stop, clipped)
            if a <= n < b:  # the data ends here: every piece is encoded, the flags can be written
                self._saturated += self._write_flags(wire, n, bucket, clipped, nonfinite[0])
            slot = self._scratch[index][i % self.depth]
            if self.two_stage:
                sent = yield from two_stage_steps(wire[a:b], _groups(channel), slot, tag=1 + i % TAGS)
            else:
                sent = yield from flat_sum_steps(wire[a:b], channel.group, slot, tag=1 + i % TAGS)
            if a < stop:
                if w is None:
                    fp8.decode(wire[a:stop], unit[a:stop], out=flat[a:stop])
                else:
                    fp8.decode_relative(wire[a:stop], w[a:stop], self._eps, unit[a:stop], out=flat[a:stop])
            return sent

        bounds = self._segments(wire.numel(), channel)
        sent = run_pipelined((piece(i, a, b) for i, (a, b) in enumerate(bounds)), self.depth)
        self._elements += n
        self._flushed = flushed if self._flushed is None else self._flushed + flushed
        self._means[index] = flat  # decoded in place: it holds the mean now
        return sent

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        if self._dense[bucket.index]:
            if wire.data_ptr() != out.data_ptr():
                out.copy_(wire)
            return
        mean = self._means.pop(bucket.index)
        if mean.data_ptr() != out.data_ptr():
            out.copy_(mean)
        n = out.numel()
        ranges = self._scales[bucket.index][1]
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
    def _tally(self, flat: torch.Tensor, w: torch.Tensor | None, send: torch.Tensor, bucket: BucketView,
               a: int, stop: int, clipped: list[int]) -> bool:
        """Add each tensor's elements in [a, stop) that clipped to `clipped`; return whether one was not finite.
        Runs before the piece is decoded over its gradient, and only for a piece whose max says it must."""
        for j, (start, size) in enumerate(zip(bucket.offsets, (p.numel() for p in bucket.params))):
            lo, hi = max(a, start), min(stop, start + size)
            if lo < hi:
                clipped[j] += int(fp8.clipped(flat[lo:hi], send[lo:hi], None if w is None else w[lo:hi],
                                              self._eps).sum())
        return not bool(torch.isfinite(flat[a:stop]).all())  # an inf from scaling a finite value only saturates

    def _write_flags(self, wire: torch.Tensor, n: int, bucket: BucketView, clipped: list[int], nonfinite: bool) -> int:
        """Write the non-finite byte, then each tensor's saturation byte: raised when it clips more than the limit
        beyond the 1 − Q that its quantile lets through by design; return the elements saturated."""
        limit, allowed = self.options.saturation_limit, self.options.saturation_limit + 1 - self.options.quantile
        flags = [nonfinite] + [limit > 0 and count > allowed * p.numel() for count, p in zip(clipped, bucket.params)]
        wire[n:n + len(flags)] = torch.tensor(flags, dtype=torch.uint8) * fp8.ONE_CODE
        return sum(clipped)

    def counters(self) -> dict[str, float]:
        if not self._elements:
            return {}
        elements, saturated, flushed = self._elements, self._saturated, int(self._flushed)
        self._elements, self._saturated, self._flushed = 0, 0, None
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
            local = _groups(channel).topology.procs_per_node if self.two_stage else 1
            wire = torch.zeros(-(-length // local) * local, dtype=torch.uint8, device=device)
            pieces = self._segments(wire.numel(), channel)
            piece = max(b - a for a, b in pieces)
            size = scratch_size(piece, _groups(channel)) if self.two_stage else -(-piece // channel.world_size)
            slots = min(self.depth, len(pieces))
            self._scratch[index] = list(torch.empty(slots, size, dtype=torch.uint8, device=device))
            self._wires[index], self._lengths[index] = wire, length
        return wire

    def _segments(self, length: int, channel: Channel) -> list[tuple[int, int]]:
        """The pieces a wire of `length` bytes travels in: `segment` long (a multiple of the node's ranks, so the
        two-stage sum pads none), the last one shorter."""
        local = _groups(channel).topology.procs_per_node if self.two_stage else 1
        step = -(-self.segment // local) * local
        return [(a, min(a + step, length)) for a in range(0, length, step)]

    def _measure(self, g: torch.Tensor, w: torch.Tensor | None, bucket: BucketView, keys: list[int],
                 positions: list[int], channel: Channel) -> None:
        """Fresh ranges for the tensors at `positions`: each rank's sampled quantile and exact max |D|,
        max-reduced so every rank scales alike."""
        found = torch.empty(2 * len(positions))
        for i, (key, j) in enumerate(zip(keys, positions)):
            # samples drawn from (seed, rank, tensor, step) alone: a resumed run draws what it would have
            step = self._tensors[key].step
            gen = torch.Generator().manual_seed(hash((self._seed, _rank(), key, step)) & (2 ** 62 - 1))
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
            spread = first_sum_ranks(_groups(channel)) if self.two_stage else channel.world_size
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


def _rank() -> int:
    """This process's global rank, read when sampling: a codec may be built before the process group exists (a
    DDP hook state made in a Lightning script)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
