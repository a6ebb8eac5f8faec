"""Top-k sparsification with residuals after Ju et al. 2024 (DLGS, dynamic layer-wise gradient sparsification and
gradient merging): DLGS's reused thresholds, or an exact top-k each step; and
Deep Gradient Compression's corrections (Lin et al.): momentum correction with factor masking, density
warm-up, local gradient clipping.

Per bucket (a layer, or a group of layers merged by the planner) and per rank:
v = residual + gradient; the entries with |v| ≥ H are sent, the rest stay as the next residual.
H is the exact threshold — the k-th largest |v|, k = ⌈ρ·n⌉ — recomputed every `reuse` steps and
reused in between (DLGS), unless the reused H would send more than 2k or fewer than k/2 entries (a threshold
that drifted as the gradients grew or shrank: the bytes stay within 2× of what the density promises); `reuse=1`
is an exact top-k every step (LAGS per layer, global Top-K on one bucket holding everything). With momentum
correction v accumulates the local momentum u = m·u + g instead of g, and u is zeroed where v was sent; the
optimizer then applies no momentum of its own to the gradient (`scalesgd.optim.MomentumCorrectedSGD`). Under Adam
the momentum is its average u = β1·u + (1 − β1)·g and the optimizer steps with what arrives as Adam's momentum, its
variance frozen where compression starts (`scalesgd.optim.OneBitAdam`): with a fixed per-coordinate rate Adam is
momentum SGD, whose momentum DGC's correction carries.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from scalesgd import checks
from scalesgd.comm.codecs.base import BucketView, Channel, Codec, Exchange, Piece, Scratch
from scalesgd.comm.wire.compact import COMPACT, FP16_MAX, PLAIN, SPARSE_WIRES, SparseWire
from scalesgd.comm.wire.pipeline import Steps
from scalesgd.comm.wire.sparse import Gathered, allgather_sparse_steps, mean_of_sparse
from scalesgd.options import option


@dataclass(frozen=True)
class TopkOptions:
    """The sparse codecs' options (topk, topk-global, topk-nodes, lags): what fraction travels, how long a
    threshold serves, and Deep Gradient Compression's corrections."""

    density: float = option(0.1, "sparse codecs: fraction of each group's entries sent", flag="--density",
                            check=checks.within(0, 1, low_open=True))
    reuse: int = option(10, "topk: exact threshold recomputed every S steps, reused between",
                        check=checks.at_least(1, "1 recomputes the threshold every step"))
    momentum_correction: bool = option(False, "sparse codecs: DGC's momentum correction (the exchange accumulates the "
                                       "velocity, masked where sent; SGD keeps momentum for the decay only; with "
                                       "adamw, Adam's momentum, its variance frozen where compression starts)",
                                       flag="--momentum-correction", own=True)
    density_warmup: int = option(4, "sparse codecs: density rises exponentially to --density over this many epochs "
                                 "once compression starts (DGC's warm-up; measured: ρ 0.001 −0.25 points instead of "
                                 "−4.25); 0: off; a DDP hook that is not told the epoch's length assumes 200 steps "
                                 "(`scalesgd.comm.codecs.registry.step_defaults`)", flag="--density-warmup",
                                 check=checks.at_least(0), own=True)
    local_clip: float = option(0.0, "sparse codecs: each tensor's local gradient clipped to this norm ÷ √workers "
                               "before it accumulates (DGC); 0: off", flag="--local-clip",
                               check=checks.finite_non_negative, own=True)
    wire: str = option("compact", "sparse codecs: how a sent entry travels: compact (its value in fp16, the "
                       "rounding kept in the residual, and its index as 16 bits within its block of 65,536 elements "
                       "or as a bitmap, whichever is smaller: at most 4 bytes) or plain (int32 index, fp32 value: 8 "
                       "bytes)", choices=tuple(SPARSE_WIRES), own=True)

    def dgc(self, momentum: float, nesterov: bool, steps_per_epoch: int | None, average: bool = False) -> DgcOptions:
        """The corrections for a run whose optimizer has `momentum` (an average of the gradients where `average`:
        Adam's β1) and whose epochs are `steps_per_epoch` long."""
        return DgcOptions(momentum=momentum if self.momentum_correction else 0.0, nesterov=nesterov,
                          warmup_epochs=self.density_warmup if steps_per_epoch else 0,
                          steps_per_epoch=steps_per_epoch or 1, clip=self.local_clip, average=average)


@dataclass(frozen=True)
class DgcOptions:
    """DGC's corrections as a codec applies them; the defaults leave DLGS as Ju et al. have it."""

    momentum: float = 0.0  # > 0: momentum correction with this momentum (the optimizer's)
    nesterov: bool = False
    warmup_epochs: int = 0  # density rises exponentially to its target over this many epochs
    steps_per_epoch: int = 1
    clip: float = 0.0  # > 0: each tensor's local gradient clipped to this norm ÷ √ranks before it accumulates
    average: bool = False  # Adam's momentum, u ← m·u + (1 − m)·g, kept through the dense steps, which pass unchanged

    def density_at(self, density: float, step: int) -> float:
        """The density of a step during warm-up: ρ^((e+1)/(W+1)) in epoch e < W (DGC's exponential ramp)."""
        epoch = step // max(self.steps_per_epoch, 1)
        if epoch >= self.warmup_epochs:
            return density
        return max(density ** ((epoch + 1) / (self.warmup_epochs + 1)), density)


class _Sparse:
    """One bucket's residual (the accumulated velocity with momentum correction), momentum, threshold, step, and
    the parameters it holds in order (`keys`, `sizes`; None for a bucket that is not made of whole parameters)."""

    def __init__(self, numel: int, device: torch.device, momentum: bool, keys: tuple[int, ...] | None = None,
                 sizes: tuple[int, ...] | None = None):
        self.residual = torch.zeros(numel, device=device)
        self.momentum = torch.zeros(numel, device=device) if momentum else None
        self.threshold = 0.0
        self.density = 0.0  # the density the threshold was computed for
        self.step = 0
        self.keys, self.sizes = keys, sizes

    def pieces(self):
        """(parameter number, its residual, its momentum) for each parameter the bucket holds."""
        offsets = itertools.accumulate(self.sizes or (), initial=0)
        for key, start, size in zip(self.keys or (), offsets, self.sizes or ()):
            yield key, self.residual[start:start + size], (
                self.momentum[start:start + size] if self.momentum is not None else None)


class TopkCodec(Codec):
    """Send ⌈density·n⌉ (about, between recomputations) entries per bucket as (index, value) pairs.

    Selection runs in backward as soon as a bucket is full, as DLGS's timing model has it. A bucket
    whose local gradient is not finite sends nothing, keeps its residual, and raises a flag that makes
    the exchanged bucket NaN on every rank.
    """

    encode_in_backward = True
    keeps_gradients = True  # residuals
    MAX_DRIFT = 2.0  # a reused threshold sends between k ÷ this and k × this; outside, the exact top-k is taken again

    def __init__(self, name: str = "topk", density: float = 0.1, reuse: int = 1, dgc: DgcOptions = DgcOptions(),
                 wire: str = "compact"):
        self.name, self.density, self.reuse, self.dgc = name, density, reuse, dgc
        self.wire = SPARSE_WIRES[wire]
        self._state: dict[int, _Sparse] = {}
        self._owner: dict[int, _Sparse] = {}  # parameter number → the bucket state holding its residual
        self._counts = torch.zeros(4, dtype=torch.float64)  # sent, elements, Σ residual², Σ gradient²

    def k(self, numel: int, density: float | None = None) -> int:
        return max(1, math.ceil((self.density if density is None else density) * numel))

    def start(self, flat: torch.Tensor, bucket: BucketView, channel: Channel, scratch: Scratch) -> Exchange:
        """Accumulate, select, keep the rest: all of the encoding, on backward's path."""
        idx, values, not_finite = self.sparsify(flat, bucket, channel.world_size)
        return TopkExchange(flat, idx, values, not_finite, channel.group, self.wire)

    def sparsify(self, flat: torch.Tensor, bucket: BucketView, ranks: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(indices, values, whether the gradient was not finite) to send for `flat`; what is not sent stays as the
        bucket's residual."""
        st = self._bucket(bucket, flat)
        density = self.dgc.density_at(self.density, st.step)
        st.step += 1
        if not bool(torch.isfinite(flat).all()):
            return flat.new_empty(0, dtype=torch.int32), flat.new_empty(0), True
        if self.dgc.clip > 0:
            self._clip(flat, bucket, ranks)
        gradient_sq = flat.square().sum()
        if st.momentum is None:
            v = st.residual.add_(flat)
        elif self.dgc.average:
            v = st.residual.add_(st.momentum.mul_(self.dgc.momentum).add_(flat, alpha=1 - self.dgc.momentum))
        elif self.dgc.nesterov:
            v = st.residual.add_(st.momentum.add_(flat).mul_(self.dgc.momentum)).add_(flat)
        else:
            v = st.residual.add_(st.momentum.mul_(self.dgc.momentum).add_(flat))
        idx = self.select(v, st, density)
        values = v[idx]
        if self.wire is COMPACT:  # what fp16 holds is sent; the rounding (and any excess over its range) stays
            sent = values.clamp(-FP16_MAX, FP16_MAX).to(torch.float16).to(values.dtype)
            v[idx] = values - sent
            values = sent
        else:
            v[idx] = 0  # what is sent leaves the residual; the rest stays
        if st.momentum is not None and not self.dgc.average:
            st.momentum[idx] = 0  # momentum factor masking (Adam's average is kept: with its variance frozen, what is
            #                       sent adds up to the dense momentum's steps, delayed, which masking would cut)
        wire_idx = idx.to(torch.int32) if flat.numel() < 2 ** 31 else idx  # 4 bytes per index on the wire
        self._counts += torch.stack([torch.tensor(float(idx.numel())), torch.tensor(float(flat.numel())),
                                     v.square().sum().double().cpu(), gradient_sq.double().cpu()])
        return wire_idx, values, False

    def select(self, v: torch.Tensor, st: _Sparse, density: float | None = None) -> torch.Tensor:
        """Indices to send: the exact top-k at recompute steps, when the density changed, or when the reused H
        would let through more than MAX_DRIFT·k or fewer than k ÷ MAX_DRIFT (setting H afresh); else |v| ≥ H."""
        density = self.density if density is None else density
        magnitude = v.abs()
        k = self.k(v.numel(), density)
        if (st.step - 1) % self.reuse != 0 and density == st.density:
            keep = magnitude >= st.threshold if st.threshold > 0 else magnitude > 0  # H = 0: nothing is zero-worthy
            idx = torch.nonzero(keep).view(-1)
            if k / self.MAX_DRIFT <= idx.numel() <= self.MAX_DRIFT * k:
                return idx
        top = torch.topk(magnitude, k, sorted=False)
        st.threshold, st.density = float(top.values.min()), density
        return top.indices

    def after_dense(self, out: torch.Tensor, bucket: BucketView) -> None:
        """A dense step (before compression starts) still carries momentum when the optimizer has none; Adam's
        momentum is only kept (Adam's dense warm-up steps with the mean gradient, and its variance)."""
        if self.dgc.momentum <= 0:
            return
        st = self._bucket(bucket, out)
        if self.dgc.average:
            st.momentum.mul_(self.dgc.momentum).add_(out, alpha=1 - self.dgc.momentum)
        elif self.dgc.nesterov:
            out.add_(st.momentum.add_(out).mul_(self.dgc.momentum))
        else:
            out.copy_(st.momentum.mul_(self.dgc.momentum).add_(out))

    def save_bucket(self, bucket: BucketView):
        st = self._state.get(bucket.index)
        if st is None:
            return None
        return st, st.residual.clone(), None if st.momentum is None else st.momentum.clone(), (
            st.threshold, st.density, st.step)

    def restore_bucket(self, bucket: BucketView, saved) -> None:
        """The residual, momentum, threshold and step as before the step; a bucket's first step leaves no state."""
        if saved is None:
            dropped = self._state.pop(bucket.index, None)
            self._owner = {key: st for key, st in self._owner.items() if st is not dropped}
            return
        st, residual, momentum, (st.threshold, st.density, st.step) = saved
        self._state[bucket.index] = st
        st.residual.copy_(residual)
        if momentum is not None:
            st.momentum.copy_(momentum)
        self._own(st)

    def _bucket(self, bucket: BucketView, like: torch.Tensor) -> _Sparse:
        """The bucket's state; when the bucket now holds other parameters than before (DDP rebuilds its buckets
        after the first iteration), a new state that carries each parameter's residual and momentum over."""
        keys = tuple(bucket.keys) if bucket.params else None
        st = self._state.get(bucket.index)
        if st is not None and st.residual.numel() == like.numel() and (st.keys == keys or st.keys is None):
            if st.keys is None and keys is not None:  # a state saved before buckets were keyed: adopt these
                st.keys, st.sizes = keys, tuple(p.numel() for p in bucket.params)
                self._own(st)
            return st
        st = self._state[bucket.index] = _Sparse(like.numel(), like.device, self.dgc.momentum > 0, keys,
                                                 tuple(p.numel() for p in bucket.params) if keys else None)
        if keys is not None:
            self._carry_over(st)
        return st

    def _carry_over(self, st: _Sparse) -> None:
        """Fill a new bucket state from the states that held its parameters. The same parameters in another order
        (DDP's first bucket, then its rebuilt one, also after a resume) keep their threshold and step; any other
        regrouping computes a threshold afresh."""
        before = {id(owner): owner for owner in (self._owner.get(key) for key in st.keys) if owner is not None}
        for key, residual, momentum in st.pieces():
            if key not in self._owner:
                continue
            _, old_residual, old_momentum = next(piece for piece in self._owner[key].pieces() if piece[0] == key)
            residual.copy_(old_residual)
            if momentum is not None and old_momentum is not None:
                momentum.copy_(old_momentum)
        (same,) = before.values() if len(before) == 1 else (None,)
        if same is not None and set(same.keys) == set(st.keys):
            st.threshold, st.density, st.step = same.threshold, same.density, same.step
        else:  # density -1: no threshold yet, the next selection sets one
            st.step, st.density = max((owner.step for owner in before.values()), default=0), -1.0
        self._own(st)

    def _own(self, st: _Sparse) -> None:
        for key in st.keys or ():
            self._owner[key] = st

    def _clip(self, flat: torch.Tensor, bucket: BucketView, ranks: int) -> None:
        """DGC's local clipping: each tensor's gradient to norm clip·ranks^(−1/2), before it accumulates."""
        limit = self.dgc.clip / math.sqrt(ranks)
        for start, p in zip(bucket.offsets, bucket.params):
            part = flat[start:start + p.numel()]
            part.mul_(torch.clamp(limit / (part.norm() + 1e-6), max=1.0))

    def counters(self) -> dict[str, float]:
        sent, elements, residual_sq, gradient_sq = self._counts.tolist()
        self._counts.zero_()
        if not elements:
            return {}
        return {"topk_density": sent / elements,
                "topk_residual_ratio": math.sqrt(residual_sq / gradient_sq) if gradient_sq else 0.0}

    def state_dict(self) -> dict:
        return {"buckets": {i: {"residual": s.residual, "momentum": s.momentum, "threshold": s.threshold,
                                "density": s.density, "step": s.step,
                                "keys": list(s.keys) if s.keys is not None else None,
                                "sizes": list(s.sizes) if s.sizes is not None else None}
                            for i, s in self._state.items()}}

    def load_state_dict(self, state: dict) -> None:
        self._state, self._owner = {}, {}
        for i, saved in state["buckets"].items():
            keys, sizes = saved.get("keys"), saved.get("sizes")
            st = self._state[int(i)] = _Sparse(saved["residual"].numel(), saved["residual"].device,
                                               saved["momentum"] is not None,
                                               tuple(int(k) for k in keys) if keys is not None else None,
                                               tuple(int(n) for n in sizes) if sizes is not None else None)
            st.residual.copy_(saved["residual"])
            if st.momentum is not None:
                st.momentum.copy_(saved["momentum"])
            st.threshold, st.density, st.step = float(saved["threshold"]), float(saved["density"]), int(saved["step"])
            self._own(st)


class TopkExchange(Exchange):
    """One piece: every rank's (index, value) pairs gathered around the ring, then their mean, or NaN where some
    rank's gradient was not finite."""

    def __init__(self, out: torch.Tensor, idx: torch.Tensor, values: torch.Tensor, not_finite: bool, group,
                 wire: SparseWire = PLAIN):
        self.out, self.idx, self.values, self.not_finite, self.group = out, idx, values, not_finite, group
        self.wire = wire
        self.bounds = [(0, out.numel())]
        self.gathered: Gathered | None = None

    def transfer(self, piece: Piece) -> Steps:
        self.gathered = yield from allgather_sparse_steps(self.idx, self.values, self.group, self.not_finite,
                                                          piece.tag, self.wire, self.out.numel())
        return self.gathered.sent

    def decode(self, piece: Piece) -> None:
        if self.gathered.flagged:
            self.out.fill_(math.nan)  # some rank's gradient was not finite: every rank sees it
        else:
            mean_of_sparse(self.out, self.gathered.indices, self.gathered.values)
