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
from scalesgd.comm.codecs.state import FlatState, Held, keys_of
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


@dataclass
class _Threshold:
    """What a bucket's selection keeps across steps: the threshold H, the density it was taken at (-1: none yet, the
    next selection takes one) and the bucket's steps."""

    threshold: float = 0.0
    density: float = -1.0
    step: int = 0


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
        # each parameter's residual (and velocity, with momentum correction), flat in its bucket's layout
        self._flat = FlatState(("residual", "momentum") if dgc.momentum > 0 else ("residual",), torch.float32)
        self._thresholds: dict[tuple[int, ...], _Threshold] = {}  # a bucket's parameter keys → its selection's
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
        held, st = self._bucket(bucket, flat)
        residual, momentum = held.tensors["residual"], held.tensors.get("momentum")
        density = self.dgc.density_at(self.density, st.step)
        st.step += 1
        if not bool(torch.isfinite(flat).all()):
            return flat.new_empty(0, dtype=torch.int32), flat.new_empty(0), True
        if self.dgc.clip > 0:
            self._clip(flat, bucket, ranks)
        gradient_sq = flat.square().sum()
        if momentum is None:
            v = residual.add_(flat)
        elif self.dgc.average:
            v = residual.add_(momentum.mul_(self.dgc.momentum).add_(flat, alpha=1 - self.dgc.momentum))
        elif self.dgc.nesterov:
            v = residual.add_(momentum.add_(flat).mul_(self.dgc.momentum)).add_(flat)
        else:
            v = residual.add_(momentum.mul_(self.dgc.momentum).add_(flat))
        idx = self.select(v, st, density)
        values = v[idx]
        if self.wire is COMPACT:  # what fp16 holds is sent; the rounding (and any excess over its range) stays
            sent = values.clamp(-FP16_MAX, FP16_MAX).to(torch.float16).to(values.dtype)
            v[idx] = values - sent
            values = sent
        else:
            v[idx] = 0  # what is sent leaves the residual; the rest stays
        if momentum is not None and not self.dgc.average:
            momentum[idx] = 0  # momentum factor masking (Adam's average is kept: with its variance frozen, what is
            #                       sent adds up to the dense momentum's steps, delayed, which masking would cut)
        wire_idx = idx.to(torch.int32) if flat.numel() < 2 ** 31 else idx  # 4 bytes per index on the wire
        self._counts += torch.stack([torch.tensor(float(idx.numel())), torch.tensor(float(flat.numel())),
                                     v.square().sum().double().cpu(), gradient_sq.double().cpu()])
        return wire_idx, values, False

    def select(self, v: torch.Tensor, st: _Threshold, density: float | None = None) -> torch.Tensor:
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
        momentum = self._bucket(bucket, out)[0].tensors["momentum"]
        if self.dgc.average:
            momentum.mul_(self.dgc.momentum).add_(out, alpha=1 - self.dgc.momentum)
        elif self.dgc.nesterov:
            out.add_(momentum.add_(out).mul_(self.dgc.momentum))
        else:
            out.copy_(momentum.mul_(self.dgc.momentum).add_(out))

    def save_bucket(self, bucket: BucketView, flat: torch.Tensor):
        """The bucket's residual and velocity as the coming step finds them (None: it has none yet), and the
        thresholds of the buckets its parameters were in."""
        keys = set(keys_of(bucket))
        before = {k: (st.threshold, st.density, st.step) for k, st in self._thresholds.items() if set(k) & keys}
        held = self._held_before(bucket, flat)
        return (None if held is None else {name: t.clone() for name, t in held.tensors.items()}), before

    def _held_before(self, bucket: BucketView, flat: torch.Tensor) -> Held | None:
        """The bucket's state its coming step starts from: laid out now where the bucket is new, with each
        parameter's residual carried over, so that a step undone leaves it as a retry would find it."""
        return self._bucket(bucket, flat)[0]

    def restore_bucket(self, bucket: BucketView, saved) -> None:
        tensors, before = saved
        keys = keys_of(bucket)
        if tensors is None:  # its first step: it leaves no state
            self._flat.drop(keys)
        else:
            for name, t in tensors.items():
                self._flat.find(keys).tensors[name].copy_(t)
        for overlapping in [k for k in self._thresholds if set(k) & set(keys)]:
            del self._thresholds[overlapping]
        self._thresholds.update({k: _Threshold(*values) for k, values in before.items()})

    def _bucket(self, bucket: BucketView, like: torch.Tensor) -> tuple[Held, _Threshold]:
        """The bucket's residual and selection state. A bucket of other parameters than before (DDP rebuilds its
        buckets after the first step, also after a resume) carries each parameter's residual over; the same
        parameters in another order keep their threshold and step, any other regrouping takes a threshold afresh."""
        held = self._flat.of(bucket, like)
        st = self._thresholds.get(held.keys)
        if st is None or held.new:
            owners = [keys for keys in self._thresholds if set(keys) & set(held.keys)]
            if len(owners) == 1 and set(owners[0]) == set(held.keys):
                same = self._thresholds[owners[0]]
                st = _Threshold(same.threshold, same.density, same.step)
            else:
                st = _Threshold(step=max((self._thresholds[k].step for k in owners), default=0))
            for keys in owners:
                del self._thresholds[keys]
            self._thresholds[held.keys] = st
        return held, st

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
        """Each parameter's residual and velocity, and each bucket's threshold by its parameters' keys."""
        return {"flat": self._flat.state_dict(),
                "thresholds": [{"keys": list(keys), "threshold": st.threshold, "density": st.density, "step": st.step}
                               for keys, st in sorted(self._thresholds.items())]}

    def shared_state_dict(self) -> dict:
        """Nothing: each rank's residuals, velocities and thresholds are its own (a joiner's start at zero)."""
        return {"flat": {"params": {}, "regions": []}, "thresholds": []}

    def load_state_dict(self, state: dict) -> None:
        if "buckets" in state:  # saved by bucket (before state was keyed by parameter): each bucket's keys say whose
            state = _by_parameter(state["buckets"])
        self._flat.load_state_dict(state["flat"])
        self._thresholds = {tuple(int(k) for k in saved["keys"]): _Threshold(
            float(saved["threshold"]), float(saved["density"]), int(saved["step"])) for saved in state["thresholds"]}


def _by_parameter(buckets: dict) -> dict:
    """A state saved by bucket index, as `TopkCodec.state_dict` keys it now: each parameter's slices, each bucket's
    threshold under its parameters' keys (a bucket saved without them under its index, as a region)."""
    params, regions, thresholds = {}, [], []
    for index, saved in buckets.items():
        names = [n for n in ("residual", "momentum") if saved.get(n) is not None]
        keys, sizes = saved.get("keys"), saved.get("sizes")
        if keys is None:
            keys = [-1 - int(index)]
            regions.append({"keys": keys, **{n: saved[n] for n in names}})
        else:
            for key, start, size in zip(keys, itertools.accumulate(sizes, initial=0), sizes):
                params[int(key)] = {n: saved[n][start:start + size] for n in names}
        thresholds.append({"keys": keys, "threshold": saved["threshold"], "density": saved["density"],
                           "step": saved["step"]})
    return {"flat": {"params": params, "regions": regions}, "thresholds": thresholds}


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
