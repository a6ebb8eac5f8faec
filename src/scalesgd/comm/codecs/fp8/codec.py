"""fp8 (e5m2) exchange after Oyama et al. 2020 (reducing the communication of data-parallel training with
low-precision floats): relative data, a per-tensor quantile range, a two-stage sum; with the guardrails a user
needs: ranges that are never stale zeros, headroom, non-finite gradients kept visible, saturation counted, and a
tensor whose saturation stays high sent dense.

The engine pipelines the pieces of a bucket: while some are on the wire this process encodes the next and
decodes the summed ones, so the arithmetic hides behind the transfers (Oyama et al.'s 3.21× over fp32 needs
it: run one after another, encode, sum and decode cost more than the bytes they save)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from scalesgd.comm.codecs.base import BucketView, Channel, Codec, Exchange, Piece, Scratch, own_row
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.codecs.fp8 import kernels as fp8
from scalesgd.comm.codecs.fp8.ranges import Fp8Options, TensorRange, sample_quantiles
from scalesgd.comm.codecs.fp8.sums import (
    first_sum_ranks,
    flat_sum_steps,
    saturating_add_into,
    scratch_size,
    two_stage_steps,
)
from scalesgd.comm.wire.collectives import ring_reduce_scatter_rows_steps, ring_scratch
from scalesgd.comm.wire.pipeline import Steps
from scalesgd.comm.wire.topology import TopologyGroups


class Fp8Codec(Codec):
    """Gradients travel as one e5m2 byte each, then one byte flagging a non-finite bucket and one byte per
    tensor flagging saturation.

    `relative`: send D = g/(|w|+ε) and multiply |w|+ε back after (False: the gradient itself, Oyama et
    al.'s "direct" ablation). `two_stage`: the node-hierarchical sum (False: one fp8 ring over all
    ranks, their other ablation). `every_step`: it exchanges every step, which pays for compiling the CPU kernels
    (False: periodic rounds, which take the eager ones unless `SCALESGD_FP8_KERNELS=compiled`). Every `period`
    steps each tensor's range q is re-estimated from `samples` random elements and max-reduced over ranks; values
    are scaled so that headroom·q maps to 57344 ÷ P′ (two-stage) or ÷ P (flat), which keeps the sums in range. A
    range that measures 0 or non-finite is not a range: the tensor's exact max |D| stands in and it is measured
    again the next step. When some rank saturates more than `saturation_limit` of a tensor's elements
    for `saturation_window` steps in a row, that tensor's bucket is exchanged dense (fp32) from then on.

    Range state belongs to parameter tensors, not buckets, so it survives any regrouping (DDP
    rebuilds its buckets after the first iteration, also after a resume): it is keyed by the bucket's keys.
    """

    def __init__(self, name: str = "fp8", relative: bool = True, two_stage: bool = True,
                 options: Fp8Options = Fp8Options(), seed: int = 0, every_step: bool = True):
        self.name, self.relative, self.two_stage, self.options = name, relative, two_stage, options
        self.every_step = every_step
        self._tensors: dict[int, TensorRange] = {}  # parameter number → its range
        self.eps = torch.tensor(options.eps)  # ε of the relative data, as the kernels take it
        self._seed = seed
        self._elements = 0
        self._saturated = 0
        self._flushed: torch.Tensor | None = None  # on the gradients' device: read when the counters are
        self._notices: list[tuple[torch.Tensor, str]] = []
        fp8.kernel_mode(every_step)  # compiled now where that pays, not inside the first exchange

    def start(self, flat: torch.Tensor, bucket: BucketView, channel: Channel, scratch: Scratch) -> Exchange:
        """Fix this step's scales (measuring the ranges that are due, a collective) and lay out the wire."""
        ranges = [self._tensors.setdefault(key, TensorRange()) for key in bucket.keys]
        if any(r.dense for r in ranges):
            return DENSE.start(flat, bucket, channel, scratch)
        w = self._flat_weights(bucket, flat, scratch) if self.relative else None
        due = [j for j, r in enumerate(ranges) if r.due(self.options.period)]
        if due:
            self._measure(flat, w, bucket, [bucket.keys[j] for j in due], due, channel)
        for r in ranges:
            r.step += 1
        unit, send = self._scale(bucket, ranges, flat.device, channel, scratch)
        local = _groups(channel).topology.procs_per_node if self._staged(channel) else 1
        length = flat.numel() + 1 + len(ranges)  # data, the non-finite flag, a saturation flag per tensor
        wire = scratch.tensor("wire", -(-length // local) * local, torch.uint8, flat.device)  # padded to P′ parts
        return Fp8Exchange(self, flat, w, unit, send, wire, bucket, ranges, channel, scratch, local)

    # ---- guardrails ------------------------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        if not self._elements:
            return {}
        elements, saturated, flushed = self._elements, self._saturated, int(self._flushed)
        self._elements, self._saturated, self._flushed = 0, 0, None
        return {"fp8_saturated": saturated / elements, "fp8_flushed": flushed / elements}

    def pop_notices(self) -> list[tuple[torch.Tensor, str]]:
        notices, self._notices = self._notices, []
        return notices

    def count(self, elements: int, saturated: int, flushed: torch.Tensor) -> None:
        """Add one bucket's elements, saturated elements and flushed count (on the device) to the counters."""
        self._elements += elements
        self._saturated += saturated
        self._flushed = flushed if self._flushed is None else self._flushed + flushed

    def heat(self, bucket: BucketView, ranges: list[TensorRange], flags: list[int]) -> None:
        """Count each tensor's steps in a row with its saturation flag raised; past the window it goes dense."""
        for param, r, hot in zip(bucket.params, ranges, flags):
            r.hot = r.hot + 1 if hot else 0
            if r.hot >= self.options.saturation_window and not r.dense:
                r.dense = True
                self._notices.append((param, f"fp8 saturated above {self.options.saturation_limit:g} of its "
                                             f"elements on some rank for {r.hot} steps: its bucket is exchanged "
                                             f"dense from its step {r.step + 1}"))

    # ---- the range, the scale, the weights -------------------------------------------------------
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

    def _scale(self, bucket: BucketView, ranges: list[TensorRange], device: torch.device, channel: Channel,
               scratch: Scratch) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-element 57344/(headroom·q) for decode, that ÷ the ranks of the first sum for encode), kept with the
        bucket until a range changes."""
        def make() -> tuple[torch.Tensor, torch.Tensor]:
            spread = first_sum_ranks(_groups(channel)) if self._staged(channel) else channel.world_size
            sizes = torch.tensor([p.numel() for p in bucket.params], device=device)
            top = torch.tensor([self.options.headroom * r.q for r in ranges], device=device)
            unit = torch.repeat_interleave(fp8.MAX / top, sizes)
            return unit, unit / spread

        return scratch.memo("scale", (device, *((id(r), r.q) for r in ranges)), make)

    def _staged(self, channel: Channel) -> bool:
        """Whether this exchange sums in two stages: where the codec does, unless it ends in a reduce-scatter (one
        ring over the group: FSDP's shards)."""
        return self.two_stage and not channel.scatter

    def _flat_weights(self, bucket: BucketView, like: torch.Tensor, scratch: Scratch) -> torch.Tensor:
        """The bucket's parameters as one flat float32 vector in the gradient buffer's layout."""
        params = bucket.params
        if len(params) == 1 and params[0].dtype == torch.float32 and params[0].is_contiguous():
            return params[0].detach().view(-1)  # already flat: no copy
        flat = scratch.tensor("weights", like.numel(), torch.float32, like.device)
        torch.cat([p.detach().reshape(-1).float() for p in params], out=flat)
        return flat

    # ---- undo and checkpoint ---------------------------------------------------------------------
    def save_bucket(self, bucket: BucketView, flat: torch.Tensor):
        """The bucket's ranges as the coming step finds them (None: a tensor has none yet)."""
        return {key: self._tensors[key].state_dict() if key in self._tensors else None for key in bucket.keys}

    def restore_bucket(self, bucket: BucketView, saved) -> None:
        for key, state in saved.items():
            if state is None:
                self._tensors.pop(key, None)
            else:  # in place: the bucket's cached scales are keyed by the range objects
                self._tensors[key].__dict__.update(TensorRange.from_state(state).__dict__)

    def state_dict(self) -> dict:
        return {"tensors": {key: r.state_dict() for key, r in self._tensors.items()}}

    def load_state_dict(self, state: dict) -> None:
        self._tensors = {int(key): TensorRange.from_state(saved) for key, saved in state["tensors"].items()}


class Fp8Exchange(Exchange):
    """One bucket's fp8 exchange for one step: each piece encoded into the wire, summed in fp8 (two-stage or
    flat), decoded into the gradient buffer; the flags written with the last data and read after the sum."""

    def __init__(self, codec: Fp8Codec, flat: torch.Tensor, w: torch.Tensor | None, unit: torch.Tensor,
                 send: torch.Tensor, wire: torch.Tensor, bucket: BucketView, ranges: list[TensorRange],
                 channel: Channel, scratch: Scratch, local: int):
        self.codec, self.flat, self.w, self.unit, self.send, self.wire = codec, flat, w, unit, send, wire
        self.bucket, self.ranges, self.channel, self.scratch = bucket, ranges, channel, scratch
        self.n = flat.numel()
        self.bounds = [(0, wire.numel())] if channel.scatter else channel.bounds(wire.numel(), 1, local)
        self.flushed = torch.zeros((), dtype=torch.int64, device=flat.device)
        self.clipped = [0] * len(bucket.params)  # per tensor
        self.nonfinite = False
        self.saturated = 0

    def encode(self, piece: Piece) -> None:
        a, b = self.bounds[piece.index]
        stop = min(b, self.n)
        if a < stop:
            w = None if self.w is None else self.w[a:stop]
            most, zeroed = fp8.encode_stats(self.flat[a:stop], self.wire[a:stop], self.send[a:stop], w,
                                            self.codec.eps)
            self.flushed.add_(zeroed)
            if not most.item() <= fp8.MAX:  # something clipped or is not finite: look closer (rare)
                self.nonfinite |= self._tally(a, stop)
        if a <= self.n < b:  # the data ends here: every piece is encoded, the flags can be written
            self.saturated = self._write_flags()

    def transfer(self, piece: Piece) -> Steps:
        a, b = self.bounds[piece.index]
        if self.channel.scatter:
            return self._scatter_steps(piece)
        if self.codec._staged(self.channel):
            groups = _groups(self.channel)
            size = scratch_size(max(y - x for x, y in self.bounds), groups)
            slot = self.scratch.slot(piece, "sum", size, torch.uint8, self.wire.device)
            return two_stage_steps(self.wire[a:b], groups, slot, tag=piece.tag)
        size = ring_scratch(-(-max(y - x for x, y in self.bounds) // self.channel.world_size))
        slot = self.scratch.slot(piece, "sum", size, torch.uint8, self.wire.device)
        return flat_sum_steps(self.wire[a:b], self.channel.group, slot, tag=piece.tag)

    def decode(self, piece: Piece) -> None:
        a, b = own_row(self.channel, self.n) if self.channel.scatter else self.bounds[piece.index]
        stop = min(b, self.n)
        if a >= stop:
            return
        if self.w is None:
            fp8.decode(self.wire[a:stop], self.unit[a:stop], out=self.flat[a:stop])
        else:
            fp8.decode_relative(self.wire[a:stop], self.w[a:stop], self.codec.eps, self.unit[a:stop],
                                out=self.flat[a:stop])

    def _scatter_steps(self, piece: Piece) -> Steps:
        """The data's rows summed in a ring reduce-scatter, each ending on its rank; the flags on every rank."""
        width = self.n // self.channel.world_size
        slot = self.scratch.slot(piece, "sum", ring_scratch(width), torch.uint8, self.wire.device)
        sent = yield from ring_reduce_scatter_rows_steps(self.wire[:self.n], self.channel.group, slot,
                                                         combine=saturating_add_into, tag=piece.tag)
        flags = self.wire[self.n:].to(torch.int32)  # raised on some rank: raised on every one (gloo has no byte max)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.channel.group)
        self.wire[self.n:] = flags.to(torch.uint8)
        ranks = self.channel.world_size
        return sent + 2 * (ranks - 1) * flags.numel() * flags.element_size() // ranks

    def finish(self) -> None:
        """Count, then read the summed flags: the same bytes on every rank."""
        self.codec.count(self.n, self.saturated, self.flushed)
        flags = self.wire[self.n:self.n + 1 + len(self.ranges)].tolist()
        if flags[0]:  # some rank's gradient was not finite: every rank sees it (a skipped step is undone by the engine)
            self.flat.fill_(math.nan)
            return
        self.codec.heat(self.bucket, self.ranges, flags[1:])

    def _tally(self, a: int, stop: int) -> bool:
        """Add each tensor's elements in [a, stop) that clipped to `clipped`; return whether one was not finite.
        Runs before the piece is decoded over its gradient, and only for a piece whose max says it must."""
        flat, w, send, eps = self.flat, self.w, self.send, self.codec.eps
        for j, (start, size) in enumerate(zip(self.bucket.offsets, (p.numel() for p in self.bucket.params))):
            lo, hi = max(a, start), min(stop, start + size)
            if lo < hi:
                self.clipped[j] += int(fp8.clipped(flat[lo:hi], send[lo:hi], None if w is None else w[lo:hi],
                                                   eps).sum())
        return not bool(torch.isfinite(flat[a:stop]).all())  # an inf from scaling a finite value only saturates

    def _write_flags(self) -> int:
        """Write the non-finite byte, then each tensor's saturation byte: raised when it clips more than the limit
        beyond the 1 − Q that its quantile lets through by design; return the elements saturated."""
        options = self.codec.options
        limit, allowed = options.saturation_limit, options.saturation_limit + 1 - options.quantile
        flags = [self.nonfinite] + [limit > 0 and count > allowed * p.numel()
                                    for count, p in zip(self.clipped, self.bucket.params)]
        self.wire[self.n:self.n + len(flags)] = torch.tensor(flags, dtype=torch.uint8) * fp8.ONE_CODE
        return sum(self.clipped)


def _groups(channel: Channel) -> TopologyGroups:
    """The node and cross-node groups the two-stage sum runs in (the engine builds them at start-up)."""
    if not isinstance(channel.topology, TopologyGroups):
        raise ValueError("the two-stage fp8 sum needs the node groups: pass topology=TopologyGroups "
                         "(DistributedOptimizer builds them when its codec asks)")
    return channel.topology


def _rank() -> int:
    """This process's global rank, read when sampling: a codec may be built before the process group exists (a
    DDP hook state made in a Lightning script)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
