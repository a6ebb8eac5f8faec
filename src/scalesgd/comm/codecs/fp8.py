"""fp8 (e5m2) exchange as SPEC §2: relative data, a per-tensor quantile range, a two-stage sum."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalesgd.comm import fp8
from scalesgd.comm.codecs.base import BucketView, Codec, Exchange
from scalesgd.comm.fp8_sum import flat_sum, scratch_size, two_stage_sum

Q_FLOOR = 1e-30  # an all-zero tensor's range: keeps 57344/q finite


@dataclass(frozen=True)
class Fp8Options:
    """The seed's settings: ε of the relative data, the quantile Q, its period N and sample count R."""

    eps: float = 1e-5
    quantile: float = 0.95
    period: int = 100
    samples: int = 1024

    def problems(self) -> list[str]:
        """What is wrong with these settings, one phrase each (empty when valid)."""
        out = []
        if not self.eps > 0:
            out.append(f"fp8 eps must be > 0, got {self.eps}")
        if not 0 < self.quantile <= 1:
            out.append(f"fp8 quantile must be in (0, 1], got {self.quantile}")
        if self.period < 1:
            out.append(f"fp8 period must be ≥ 1 step, got {self.period}")
        if self.samples < 1:
            out.append(f"fp8 samples must be ≥ 1, got {self.samples}")
        return out


class _Range:
    """One bucket's range state: per-tensor quantiles, the per-element scale built from them, the step."""

    def __init__(self, sizes: list[int]):
        self.sizes = sizes
        self.q: torch.Tensor | None = None
        self.unit: torch.Tensor | None = None  # 57344 / q per element: what decoding divides by
        self.send: torch.Tensor | None = None  # unit ÷ the ranks a first sum adds: what encoding multiplies by
        self.step = 0

    def set_q(self, q: torch.Tensor, spread: int, device: torch.device) -> None:
        self.q = q
        self.unit = torch.repeat_interleave(fp8.MAX / q.to(device), torch.tensor(self.sizes, device=device))
        self.send = self.unit / spread


class Fp8Codec(Codec):
    """Gradients travel as one e5m2 byte each.

    `relative`: send D = g/(|w|+ε) and multiply |w|+ε back after (False: the gradient itself, the
    seed's "direct" ablation). `two_stage`: the node-hierarchical sum (False: one fp8 ring over all
    ranks, the seed's other ablation). Every `period` steps each tensor's range q is re-estimated
    from `samples` random elements and max-reduced over ranks; values are scaled so that q maps to
    57344 ÷ P′ (two-stage) or ÷ P (flat), which keeps the sums in range.
    """

    def __init__(self, name: str = "fp8", relative: bool = True, two_stage: bool = True,
                 options: Fp8Options = Fp8Options(), seed: int = 0):
        if options.problems():
            raise ValueError("; ".join(options.problems()))
        self.name, self.relative, self.two_stage, self.options = name, relative, two_stage, options
        self.needs_topology = two_stage
        self._ranges: dict[int, _Range] = {}
        self._weights: dict[int, torch.Tensor] = {}
        self._wires: dict[int, torch.Tensor] = {}
        self._scratch: dict[int, torch.Tensor] = {}
        self._lengths: dict[int, int] = {}
        self._eps = torch.tensor(options.eps)
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self._gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
        fp8.kernel_mode()  # compile now, not inside the first exchange

    # ---- encode → communicate → decode -----------------------------------------------------------
    def encode(self, flat: torch.Tensor, bucket: BucketView, exchange: Exchange) -> torch.Tensor:
        sizes = [p.numel() for p in bucket.params]
        rng = self._ranges.get(bucket.index)
        if rng is None or rng.sizes != sizes:  # new bucket (or DDP rebuilt its buckets)
            rng = self._ranges[bucket.index] = _Range(sizes)
        w = self._flat_weights(bucket, flat) if self.relative else None
        spread = _groups(exchange).topology.procs_per_node if self.two_stage else exchange.world_size
        if rng.q is None or rng.step % self.options.period == 0:
            rng.set_q(self._measure(rng, flat, w, bucket, exchange), spread, flat.device)
        elif rng.unit is None or rng.unit.device != flat.device:  # restored from a checkpoint
            rng.set_q(rng.q, spread, flat.device)
        rng.step += 1
        wire = self._wire(bucket.index, flat, exchange)
        if w is None:
            fp8.encode(flat, rng.send, out=wire[:flat.numel()])
        else:
            fp8.encode_relative(flat, w, self._eps, rng.send, out=wire[:flat.numel()])
        return wire

    def communicate(self, wire: torch.Tensor, bucket: BucketView, exchange: Exchange) -> int:
        scratch = self._scratch[bucket.index]
        if self.two_stage:
            return two_stage_sum(wire, _groups(exchange), scratch)
        return flat_sum(wire, exchange.group, scratch)

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, exchange: Exchange) -> None:
        unit, wire = self._ranges[bucket.index].unit, wire[:out.numel()]
        if self.relative:
            fp8.decode_relative(wire, self._weights[bucket.index], self._eps, unit, out=out)
        else:
            fp8.decode(wire, unit, out=out)

    def _wire(self, index: int, flat: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        """The bucket's byte buffer (zero-padded to P′ equal parts) and the sum's scratch, kept across steps."""
        n = flat.numel()
        wire = self._wires.get(index)
        if wire is None or self._lengths[index] != n:
            if self.two_stage:
                groups = _groups(exchange)
                local = groups.topology.procs_per_node
                wire = torch.zeros(-(-n // local) * local, dtype=torch.uint8, device=flat.device)
                self._scratch[index] = torch.empty(scratch_size(n, groups), dtype=torch.uint8, device=flat.device)
            else:
                wire = torch.empty(n, dtype=torch.uint8, device=flat.device)
                self._scratch[index] = torch.empty(-(-n // exchange.world_size), dtype=torch.uint8,
                                                   device=flat.device)
            self._wires[index], self._lengths[index] = wire, n
        return wire

    # ---- the range -------------------------------------------------------------------------------
    def _measure(self, rng: _Range, g: torch.Tensor, w: torch.Tensor | None, bucket: BucketView,
                 exchange: Exchange) -> torch.Tensor:
        """This rank's per-tensor ranges, max-reduced so every rank scales alike."""
        q = sample_quantiles(g, w, bucket.offsets, rng.sizes, self.options, self._gen).to(g.device)
        dist.all_reduce(q, op=dist.ReduceOp.MAX, group=exchange.group)
        return q

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
        return {"ranges": {i: {"sizes": r.sizes, "q": r.q, "step": r.step} for i, r in self._ranges.items()},
                "generator": self._gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self._ranges = {}
        for i, saved in state["ranges"].items():
            rng = self._ranges[int(i)] = _Range(list(saved["sizes"]))
            rng.step = int(saved["step"])
            rng.q = None if saved["q"] is None else saved["q"].clone()
        self._gen.set_state(state["generator"])


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


def _groups(exchange: Exchange):
    """The node and cross-node groups the two-stage sum runs in (the engine builds them at start-up)."""
    from scalesgd.comm.topology import TopologyGroups

    if not isinstance(exchange.topology, TopologyGroups):
        raise ValueError("the two-stage fp8 sum needs the node groups: pass topology=TopologyGroups "
                         "(DistributedOptimizer builds them when its codec asks)")
    return exchange.topology
