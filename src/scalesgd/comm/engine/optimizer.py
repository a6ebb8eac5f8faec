"""DistributedOptimizer: our own gradient exchange, bucket by bucket, overlapped with back-propagation.

A gradient's path: every `.grad` is a view of its bucket's flat buffer (as DDP's
`gradient_as_bucket_view`), so autograd accumulates straight into the bucket and the
post-accumulate-grad hook only counts arrivals; when the bucket is full it is handed to the communication
thread, which runs its codec's exchange (`scalesgd.comm.engine.driver`: encode, sum across ranks, decode the
mean back into the buffer, piece by piece) while backward goes on;
`step()` waits for the last bucket (the mean is then in every `.grad`) and steps the wrapped
optimizer; `zero_grad()` zeroes each bucket with one fill. Buckets are always exchanged in plan order, so every
rank issues the same collectives in the same order whatever order its gradients arrive in.
"""

from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from scalesgd.comm.codecs import BucketView, Codec
from scalesgd.comm.engine.agreement import (
    check_ranks_agree,
    codec_from,
    describe_exchange,
)
from scalesgd.comm.engine.buckets import BucketPlan, model_tensors, plan_buckets
from scalesgd.comm.engine.driver import BucketDriver, Pending, open_channel
from scalesgd.comm.engine.policies import GradientNorms
from scalesgd.comm.wire.groups import own_group
from scalesgd.trace import Tracer, now_us


@dataclass
class IterationStats:
    """Where one iteration's exchange time went, as seen by this rank."""

    codec_s: float = 0.0  # codec arithmetic on the communication thread (encode, the sums' reduction, decode)
    comm_s: float = 0.0  # the communication thread waiting for the wire
    exposed_s: float = 0.0  # the step waiting for the exchange
    bytes_sent: int = 0
    thread_cpu_s: float = 0.0  # CPU the communication thread used: taken from compute where cores are shared

    @property
    def overlapped_s(self) -> float:
        return max(self.codec_s + self.comm_s - self.exposed_s, 0.0)


@dataclass
class _Bucket:
    """A bucket's flat buffer, the views of its parameters into it, and its per-iteration progress."""

    view: BucketView
    buffer: torch.Tensor
    slices: list[torch.Tensor]
    reported: list[bool]
    pending: int
    ready: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    prepared: Pending | None = None  # this step's exchange, handed over

    def reset(self) -> None:
        self.reported = [False] * len(self.slices)
        self.pending = len(self.slices)
        self.prepared = None


class DistributedOptimizer:
    """Wraps any torch optimizer so that `step()` uses gradients averaged over all ranks.

    codec: a name in `scalesgd.comm.codecs.CODECS` or a `Codec`; algorithm: see
    `scalesgd.comm.wire.collectives.ALGORITHMS`; buckets: a plan spec (`size:MB`, `growing`, `layer`,
    `single`) or a `BucketPlan` (e.g. the planner's). `group` is the process group for the exchange;
    by default a new one (with the default group's timeout), so the exchange never interleaves with the caller's
    own collectives. Every rank checks there that all built the same codec, options, dense start, bucket plan and
    algorithm (`RanksDisagree`, on every rank, where they did not).
    Parameters are broadcast from rank 0 at construction, and buffers (BN statistics)
    before every training forward, as DDP does. `compress_after`: each parameter's first steps exchanged dense
    (fp32) before the codec takes over; `norms`: each step's squared gradient norms counted into it; `scaler`: the
    loop's fp16 `GradScaler`, whose scale is divided out of what a codec keeps across steps and whose skipped steps
    leave no trace in the codec.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, codec: str | Codec = "fp32",
                 algorithm: str = "ring", buckets: str = "size:1", group=None, topology=None,
                 broadcast_buffers: bool = True, tracer: Tracer | None = None, compress_after: int = 0,
                 norms: GradientNorms | None = None, scaler: torch.amp.GradScaler | None = None):
        self.optimizer = optimizer
        self.model = model
        self.codec = codec_from(codec)
        self.tracer = tracer or Tracer(False)
        self.driver = BucketDriver(self.codec, None, self.tracer, compress_after, norms)
        self.driver.bind(list(model.parameters()))
        self.driver.follow(scaler)
        self.broadcast_buffers = broadcast_buffers
        params = [p for p in model.parameters() if p.requires_grad]
        _check_optimizer_covers(optimizer, params)
        self.plan: BucketPlan = (buckets if isinstance(buckets, BucketPlan)
                                 else plan_buckets(buckets, model_tensors(model)))
        # collectives from here on: every rank builds the engine together
        self.group = group if group is not None else own_group()
        check_ranks_agree(describe_exchange(self.codec, self.driver.dense_steps, self.plan, algorithm), self.group)
        self.channel = self.driver.channel = open_channel(self.codec, self.group, topology, algorithm)
        self._src = dist.get_global_rank(self.group, 0)
        self._broadcast(list(model.parameters()) + list(model.buffers()))
        self._buckets = [self._make_bucket(b, [params[i] for i in idx]) for b, idx in enumerate(self.plan.buckets)]
        self._point_grads_at_buckets()
        self._sync = True
        self._synced = False
        self._error: BaseException | None = None
        self._closing = False
        self._stats = IterationStats()
        self._stats_lock = threading.Lock()
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, bucket, j))
                       for bucket in self._buckets for j, p in enumerate(bucket.view.params)]
        self._hooks.append(model.register_forward_pre_hook(self._before_forward))
        self._thread = threading.Thread(target=self._communicate_forever, name="scalesgd-comm", daemon=True)
        self._thread.start()

    # ---- the user's side -------------------------------------------------------------------------
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero every bucket, one fill each; the gradients stay views of them (`set_to_none` is accepted and
        ignored, as under DDP's `gradient_as_bucket_view`: a None gradient would be allocated anew and copied)."""
        for bucket in self._buckets:
            bucket.buffer.zero_()
        self._point_grads_at_buckets()

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no exchange) for the backward passes inside this block."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def synchronize(self) -> None:
        """Wait for every bucket and leave the averaged gradients in `.grad` (e.g. to clip before step)."""
        if self._synced:
            return
        for bucket in self._buckets:
            if bucket.pending:  # a gradient never arrived on this rank, or backward ran under no_sync
                self._launch_incomplete(bucket)
        start = now_us()
        for bucket in self._buckets:
            bucket.done.wait()
        waited = now_us() - start
        self.tracer.add("wait for exchange", start, start + waited, "main")
        if self._error is not None:
            raise self._error
        self._point_grads_at_buckets()
        for bucket in self._buckets:
            bucket.reset()
            bucket.done.clear()
        with self._stats_lock:
            self._stats.exposed_s += waited / 1e6
        self._synced = True

    def step(self, closure=None):
        self.synchronize()
        with self.tracer.span("optimizer step"):
            result = self.optimizer.step(closure)
        self._synced = False
        return result

    def pop_stats(self) -> IterationStats:
        """This rank's exchange statistics since the last call."""
        with self._stats_lock:
            stats, self._stats = self._stats, IterationStats()
        return stats

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(),
                "engine": {"codec": self.codec.name, "codec_state": self.driver.state_dict(),
                           "buckets": self.plan.spec, "algorithm": self.channel.algorithm}}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.driver.load_state_dict(state["engine"]["codec_state"])

    def close(self) -> None:
        """Stop the communication thread and remove the hooks."""
        self._closing = True
        for bucket in self._buckets:
            bucket.ready.set()
        self._thread.join(timeout=5)
        for hook in self._hooks:
            hook.remove()

    # ---- backward side (autograd's thread) -------------------------------------------------------
    def _on_grad(self, bucket: _Bucket, j: int, p: torch.Tensor) -> None:
        self._synced = False  # a new backward: the next synchronize() has work to do
        if not self._sync:
            return
        if bucket.reported[j]:
            raise RuntimeError("a gradient was produced twice before step(); accumulate under no_sync()")
        if p.grad.data_ptr() != bucket.slices[j].data_ptr():  # the user set .grad to None or to a tensor
            bucket.slices[j].copy_(p.grad)
        bucket.reported[j] = True
        bucket.pending -= 1
        if bucket.pending == 0:
            self._hand_over(bucket)

    def _hand_over(self, bucket: _Bucket) -> None:
        """A full bucket goes to the communication thread, encoded here first if its codec says so."""
        bucket.prepared = self.driver.prepare(bucket.buffer, bucket.view)
        bucket.ready.set()

    def _launch_incomplete(self, bucket: _Bucket) -> None:
        """Fill what did not arrive by hook (local grad if any, else zeros) and hand the bucket over."""
        for j, p in enumerate(bucket.view.params):
            if not bucket.reported[j]:
                if p.grad is None:
                    bucket.slices[j].zero_()
                elif p.grad.data_ptr() != bucket.slices[j].data_ptr():
                    bucket.slices[j].copy_(p.grad)
                bucket.reported[j] = True
        bucket.pending = 0
        self._hand_over(bucket)

    def _before_forward(self, module, args) -> None:
        if self.broadcast_buffers and module.training and torch.is_grad_enabled():
            with self.tracer.span("broadcast buffers"):
                self._broadcast(list(module.buffers()))

    # ---- communication thread --------------------------------------------------------------------
    def _communicate_forever(self) -> None:
        while True:
            for bucket in self._buckets:
                bucket.ready.wait()
                bucket.ready.clear()
                if self._closing:
                    return
                try:
                    if self._error is None:
                        self._exchange_bucket(bucket)
                except BaseException as err:  # noqa: BLE001 (surfaced in the main thread by synchronize())
                    self._error = err
                bucket.done.set()

    def _exchange_bucket(self, bucket: _Bucket) -> None:
        cpu = time.thread_time()
        times = self.driver.complete(bucket.prepared)
        with self._stats_lock:
            self._stats.codec_s += times.codec_s
            self._stats.comm_s += times.wire_s
            self._stats.bytes_sent += times.bytes_sent
            self._stats.thread_cpu_s += time.thread_time() - cpu

    # ---- set-up ----------------------------------------------------------------------------------
    def _point_grads_at_buckets(self) -> None:
        """Make every parameter's `.grad` its bucket slice again where it is not (None, or set by the user)."""
        for bucket in self._buckets:
            for p, grad in zip(bucket.view.params, bucket.slices):
                if p.grad is None or p.grad.data_ptr() != grad.data_ptr():
                    p.grad = grad

    def _make_bucket(self, index: int, params: list[torch.Tensor]) -> _Bucket:
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"bucket {index} mixes dtypes {sorted(map(str, dtypes))}; use a `layer` plan")
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += p.numel()
        buffer = torch.zeros(total, dtype=params[0].dtype, device=params[0].device)
        slices = [buffer[o:o + p.numel()].view_as(p) for o, p in zip(offsets, params)]
        return _Bucket(self.driver.view(index, params, offsets, total), buffer, slices, [False] * len(params),
                       len(params))

    @torch.no_grad()
    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0's values of `tensors`, one broadcast per dtype (per-tensor calls cost a latency each)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for same in by_dtype.values():
            flat = _flatten_dense_tensors(same)
            dist.broadcast(flat, src=self._src, group=self.group)
            for t, value in zip(same, _unflatten_dense_tensors(flat, same)):
                t.copy_(value)


def _check_optimizer_covers(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """The wrapped optimizer must own exactly the model's trainable parameters."""
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = sum(1 for p in params if id(p) not in owned)
    if missing:
        raise ValueError(f"the optimizer does not own {missing} of the model's {len(params)} trainable parameters")
