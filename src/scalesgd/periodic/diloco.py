"""Periodic synchronisation around the user's own loop: each worker steps its inner optimizer alone for H steps,
then the pseudo-gradient Δ = θ_global − θ_local travels through any of our codecs and an outer optimizer steps
θ_global (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models"); or the
parameters in fragments, each synchronised on a staggered schedule while the next τ inner steps compute, merged
with the mixing factor α when it lands (Douillard et al. 2025, "Streaming DiLoCo with overlapping communication").

    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with DiLoCo(model, inner, local_steps=50, codec="fp8") as diloco:
        for x, y in batches:                 # no DDP: each worker's own loop, as it is
            loss_fn(model(x), y).backward()
            inner.step()                     # every H steps this also synchronises (a hook on the optimizer)
            inner.zero_grad()
        diloco.finish()                      # the last exchanges land: every rank holds θ_global

A lossy codec's state (top-k's residuals, fp8's ranges) is kept across rounds by parameter, as on the per-step
engine, so what a round did not send is owed in the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from scalesgd.comm.codecs import Channel, Codec, CodecSettings, make_codec
from scalesgd.comm.codecs.registry import entry_of, needs_topology
from scalesgd.comm.engine.agreement import check_ranks_agree, codec_from
from scalesgd.comm.engine.buckets import TensorInfo, plan_buckets
from scalesgd.comm.engine.driver import BucketDriver, offsets_of
from scalesgd.comm.wire.groups import own_group
from scalesgd.comm.wire.topology import Topology
from scalesgd.periodic.fragments import Schedule, split
from scalesgd.periodic.outer import outer_sgd

BUCKET_MB = 4  # a pseudo-gradient's buckets: few, large messages (it travels once a round, not behind backward)


@dataclass
class _Bucket:
    """Part of a fragment's pseudo-gradient: its parameters' indices, their global copies and the flat buffer Δ
    is written into and its mean comes back in."""

    index: int
    members: list[int]
    flat: torch.Tensor


@dataclass
class _Flight:
    """A fragment's exchange under way (or, restored from a checkpoint, landed already): its mean Δ per bucket."""

    fragment: int
    future: Future | None
    means: list[torch.Tensor] | None = None
    bytes_sent: int = 0

    def wait(self) -> list[torch.Tensor]:
        if self.means is None:
            self.means, self.bytes_sent = self.future.result()
        return self.means


class DiLoCo:
    """Synchronise `model` every `local_steps` steps of `inner_optimizer` (a hook on its `step`, while the context
    is entered, or `after_inner_step()` called by the loop): the pseudo-gradient through `codec` (a registered
    name or a `Codec`), the global parameters stepped by `outer_optimizer` (an optimizer built over the model's
    parameters, or a function building it over the parameters given; by default DiLoCo's Nesterov SGD, lr 0.7,
    momentum 0.9).

    A model sharded by FSDP2 within each node (`comm.engine.fsdp.shard_model` on the node's mesh) synchronises its
    shards: each rank's pseudo-gradient is its shards', exchanged in `group` among the ranks that hold the same ones
    (the cross-node group), and the outer optimizer steps the shards (give it as a function).

    `fragments`: the number of fragments of whole layers, or the fragments as lists of parameters; `delay` (τ): inner
    steps a fragment's exchange runs behind on the communication thread before it lands; `mix` (α): the share of the
    local parameters kept where a fragment lands (0: the global ones alone, as DiLoCo). Every rank builds it together
    (its exchange runs in its own process group, `group` or a new one) and starts from rank 0's parameters."""

    def __init__(self, model: nn.Module, inner_optimizer: torch.optim.Optimizer, local_steps: int, *,
                 outer_optimizer: torch.optim.Optimizer | Callable | None = None, codec: str | Codec = "fp32",
                 settings: CodecSettings | None = None, fragments: int | list[list[nn.Parameter]] = 1,
                 delay: int = 0, mix: float = 0.0, group=None, topology=None, buckets_mb: float = BUCKET_MB):
        if not 0.0 <= mix <= 1.0:
            raise ValueError(f"mix {mix}: give 0 to 1 (the share of the local parameters kept where a fragment lands)")
        self.model, self.inner = model, inner_optimizer
        parts = split(model, fragments) if isinstance(fragments, int) else [list(f) for f in fragments]
        self.schedule = Schedule(local_steps, len(parts), delay)
        self.mix = mix
        index = {id(p): i for i, p in enumerate(p for part in parts for p in part)}
        with torch.no_grad():
            self.params = [_own(p) for part in parts for p in part]  # what this rank holds of each
        if outer_optimizer is None or callable(outer_optimizer):
            self.outer = (outer_optimizer or outer_sgd)(self.params)
        else:
            self.outer = outer_optimizer
        self.codec = codec_from(codec if isinstance(codec, Codec) else make_codec(codec, settings))
        self.driver = BucketDriver(self.codec, None)
        with torch.no_grad():
            self.global_params = [p.detach().clone() for p in self.params]
        self.driver.bind(self.global_params)
        self.fragments = [[index[id(p)] for p in part] for part in parts]
        self._buckets: list[list[_Bucket]] = []
        for members in self.fragments:
            self._buckets.append(self._plan(members, buckets_mb, sum(map(len, self._buckets))))
        # collectives from here on: every rank builds it together
        self.group = group if group is not None else own_group()
        check_ranks_agree(f"periodic {self.codec.name} H={local_steps} F={len(parts)} τ={delay} α={mix} "
                          f"params={[tuple(p.shape) for p in self.params]}", self.group)
        if topology is None and needs_topology(self.codec):
            topology = Topology.from_env().groups()
        self.driver.channel = Channel(self.group, dist.get_world_size(self.group), topology=topology)
        self._broadcast_start()
        self.steps = 0  # inner steps taken
        self.rounds = 0  # fragments landed
        self.bytes_sent = 0
        self._flights: dict[int, _Flight] = {}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="scalesgd-periodic") if delay > 0 else None
        self._hook = None

    # ---- the user's loop -------------------------------------------------------------------------
    def __enter__(self) -> DiLoCo:
        self._hook = self.inner.register_step_post_hook(lambda *_: self.after_inner_step())
        return self

    def __exit__(self, *exc) -> bool:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._thread is not None:
            self._thread.shutdown(wait=exc[0] is None)
        return False

    def after_inner_step(self) -> None:
        """Count an inner step; start the exchange of the fragment whose turn it is and land the one that is due."""
        self.steps += 1
        started = self.schedule.starts(self.steps)
        if started is not None:
            self._start(started)
        landed = self.schedule.lands(self.steps)
        if landed is not None:
            self._land(landed)

    def finish(self) -> None:
        """Land the exchanges under way, then average every fragment whose last round was cut short by the end of
        training into the global parameters (outer SGD at lr 1 without momentum: the outer momentum, built on whole
        rounds, would carry a few steps' pseudo-gradient too far), so every rank holds them (collective)."""
        for fragment in sorted(self._flights):
            self._land(fragment)
        if self.steps % self.schedule.local_steps or self.schedule.fragments > 1:
            for fragment in range(self.schedule.fragments):
                self._start(fragment)
                self._land(fragment, average=True)
        self._copy(self.global_params, self.params)

    @contextmanager
    def global_model(self) -> Iterator[nn.Module]:
        """The model with the global parameters in place of this rank's local ones (e.g. to evaluate it, the same on
        every rank), the local ones back after."""
        local = [p.detach().clone() for p in self.params]
        self._copy(self.global_params, self.params)
        try:
            yield self.model
        finally:
            self._copy(local, self.params)

    def restart(self) -> None:
        """The global parameters from the local ones as they are (a resumed run whose rounds' state cannot be this
        rank's: another layout of shards)."""
        self._copy(self.params, self.global_params)

    # ---- one fragment's exchange -----------------------------------------------------------------
    def _start(self, fragment: int) -> None:
        """Write the fragment's Δ = θ_global − θ_local into its buckets and send them (on the communication thread
        where exchanges overlap the next inner steps)."""
        buckets = self._buckets[fragment]
        with torch.no_grad():
            for bucket in buckets:
                torch.cat([(self.global_params[i] - self.params[i]).reshape(-1).float() for i in bucket.members],
                          out=bucket.flat)
        work = self._send
        if self._thread is None:
            future: Future = Future()
            future.set_result(work(buckets))
        else:
            future = self._thread.submit(work, buckets)
        self._flights[fragment] = _Flight(fragment, future)

    def _send(self, buckets: list[_Bucket]) -> tuple[list[torch.Tensor], int]:
        sent = 0
        for bucket in buckets:
            members = [self.global_params[i] for i in bucket.members]
            view = self.driver.view(bucket.index, members, offsets_of(members), bucket.flat.numel())
            sent += self.driver.exchange(bucket.flat, view)
        return [bucket.flat for bucket in buckets], sent

    def _land(self, fragment: int, average: bool = False) -> None:
        """The fragment's mean Δ steps its global parameters with the outer optimizer (`average`: θ_global − mean Δ,
        the workers' mean); the local ones become them (α: that share of the local ones kept)."""
        flight = self._flights.pop(fragment)
        means = flight.wait()
        self.bytes_sent += flight.bytes_sent
        members = [i for bucket in self._buckets[fragment] for i in bucket.members]
        with torch.no_grad():
            saved_grads = [p.grad for p in self.params]
            local = {i: self.params[i].detach().clone() for i in members}
            for p in self.params:
                p.grad = None
            for bucket, mean in zip(self._buckets[fragment], means):
                for i, piece in zip(bucket.members, torch.split(mean, [self.params[i].numel()
                                                                        for i in bucket.members])):
                    self.params[i].copy_(self.global_params[i])
                    self.params[i].grad = piece.view_as(self.params[i]).to(self.params[i].dtype)
        if average:
            with torch.no_grad():
                for i in members:
                    self.params[i].sub_(self.params[i].grad)
        else:
            self.outer.step()
        with torch.no_grad():
            for i in members:
                self.global_params[i].copy_(self.params[i])
                if self.mix:
                    self.params[i].lerp_(local[i], self.mix)
            for p, grad in zip(self.params, saved_grads):
                p.grad = grad
        self.rounds += 1

    # ---- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state (collective where an exchange is under way: it lands in the state): the step in the
        round, the global parameters, the outer optimizer's, the codec's and the means of the exchanges not yet
        merged; the local parameters and the inner optimizer's state are the caller's."""
        inflight = {f: [m.clone() for m in flight.wait()] for f, flight in self._flights.items()}
        return {"steps": self.steps, "rounds": self.rounds, "bytes_sent": self.bytes_sent,
                "global": [p.clone() for p in self.global_params], "outer": self.outer.state_dict(),
                "codec": self.driver.state_dict(), "inflight": inflight}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.rounds, self.bytes_sent = state["steps"], state["rounds"], state["bytes_sent"]
        self._copy(state["global"], self.global_params)
        self.outer.load_state_dict(state["outer"])
        self.driver.load_state_dict(state["codec"])
        for fragment, means in state["inflight"].items():
            for bucket, mean in zip(self._buckets[fragment], means):
                bucket.flat.copy_(mean)
            self._flights[fragment] = _Flight(fragment, None, [b.flat for b in self._buckets[fragment]])

    # ---- helpers ---------------------------------------------------------------------------------
    def _plan(self, members: list[int], buckets_mb: float, first: int) -> list[_Bucket]:
        """A fragment's buckets in the codec's plan (its own bucket rule, else `buckets_mb` each), numbered from
        `first`."""
        entry = entry_of(self.codec)
        spec = entry.buckets if entry is not None and entry.buckets else f"size:{buckets_mb:g}"
        tensors = [TensorInfo(str(i), self.params[i].numel(), 4) for i in members]
        plan = plan_buckets(spec, tensors)
        out = []
        for k, chosen in enumerate(plan.buckets):
            chosen_members = [members[j] for j in sorted(chosen)]
            numel = sum(self.params[i].numel() for i in chosen_members)
            out.append(_Bucket(first + k, chosen_members, torch.zeros(numel, device=self.params[0].device)))
        return out

    def _broadcast_start(self) -> None:
        """Every rank starts from rank 0's parameters (local and global)."""
        src = dist.get_global_rank(self.group, 0)
        for p, g in zip(self.params, self.global_params):
            dist.broadcast(g, src, group=self.group)
            with torch.no_grad():
                p.copy_(g)

    @staticmethod
    def _copy(source: list[torch.Tensor], target: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for s, t in zip(source, target):
                t.copy_(s)


def _own(p: nn.Parameter) -> torch.Tensor:
    """What this rank holds of `p` and steps: a sharded parameter's (FSDP2's DTensor) local shard, sharing its
    storage; else `p`."""
    return p.to_local() if isinstance(p, DTensor) else p
