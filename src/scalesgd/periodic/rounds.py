"""A fragment of the model and its rounds: each round's pseudo-gradient Δ = θ_global − θ_local is written into the
fragment's buckets, sent through the codec's driver (on a thread of its own where it overlaps inner steps), waited
for, and then committed (the outer optimizer steps the fragment's global parameters with the mean Δ) or aborted (the
codec's state put back as the round found it, nothing stepped). Rounds in flight are keyed by (fragment, round), so an
exchange may outlast a period."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from scalesgd.comm.codecs.registry import entry_of
from scalesgd.comm.engine.buckets import TensorInfo, plan_buckets
from scalesgd.comm.engine.driver import BucketDriver, Pending, offsets_of


@dataclass
class Bucket:
    """Part of a fragment's pseudo-gradient: its parameters' indices and its size (`index`: its number among every
    fragment's buckets, the codec's scratch key)."""

    index: int
    members: list[int]
    numel: int


@dataclass
class Weights:
    """What a replica's rounds move: its own parameters (`params`: what it steps; a shard where it is sharded), its
    copies of the global ones, the outer optimizer that steps them with the mean Δ (over `params`, stepped in place
    and copied back), and where a round lands what becomes of the inner steps taken while it was in flight:
    Streaming DiLoCo's α (`mix`: the share of the local parameters kept), or `carry`: added to the new global ones."""

    params: list[torch.Tensor]
    global_params: list[torch.Tensor]
    outer: torch.optim.Optimizer
    mix: float = 0.0
    carry: bool = False


@dataclass
class Round:
    """One fragment's exchange in one round, in buffers of its own (`flats`: Δ written in, its mean back; so rounds of
    one fragment may be in flight together): under way (`future`), or landed (`means`); `pending` keeps what undoes
    the codec's work where the round may not commit; `own`: this rank's Δ as it was sent (kept where the steps in
    flight are carried: the local parameters at the start are θ_global − own)."""

    fragment: int
    number: int
    flats: list[torch.Tensor] = field(default_factory=list)
    future: Future | None = None
    means: list[torch.Tensor] | None = None
    bytes_sent: int = 0
    pending: list[Pending] = field(default_factory=list)
    own: list[torch.Tensor] | None = None

    @property
    def key(self) -> tuple[int, int]:
        return self.fragment, self.number

    def wait(self) -> list[torch.Tensor]:
        """The mean Δ of each bucket, once the exchange is done."""
        if self.means is None:
            self.means, self.bytes_sent, self.pending = self.future.result()
        return self.means


class Fragment:
    """Parameters that synchronise together (`members`: indices into the replica's parameters), in the codec's
    buckets, and the rounds of theirs in flight."""

    def __init__(self, index: int, members: list[int], buckets: list[Bucket], device: torch.device):
        self.index, self.members, self.buckets, self.device = index, members, buckets, device
        self.flights: dict[int, Round] = {}  # by round number

    @classmethod
    def plan(cls, index: int, members: list[int], params: list[torch.Tensor], driver: BucketDriver,
             buckets_mb: float, first: int) -> Fragment:
        """The fragment's buckets in the codec's own bucket rule (else `buckets_mb` each), numbered from `first`."""
        entry = entry_of(driver.codec)
        spec = entry.buckets if entry is not None and entry.buckets else f"size:{buckets_mb:g}"
        plan = plan_buckets(spec, [TensorInfo(str(i), params[i].numel(), 4) for i in members])
        buckets = []
        for k, chosen in enumerate(plan.buckets):
            chosen_members = [members[j] for j in sorted(chosen)]
            numel = sum(params[i].numel() for i in chosen_members)
            buckets.append(Bucket(first + k, chosen_members, numel))
        return cls(index, members, buckets, params[0].device)

    # ---- a round ---------------------------------------------------------------------------------------
    def deltas(self, weights: Weights) -> list[torch.Tensor]:
        """This round's Δ = θ_global − θ_local, a flat tensor a bucket."""
        global_params, params = weights.global_params, weights.params
        flats = [torch.empty(bucket.numel, device=self.device) for bucket in self.buckets]
        with torch.no_grad():
            for bucket, flat in zip(self.buckets, flats):
                torch.cat([(global_params[i] - params[i]).reshape(-1).float() for i in bucket.members], out=flat)
        return flats

    def start(self, number: int, weights: Weights, driver: BucketDriver, thread: ThreadPoolExecutor | None,
              undoable: bool, deltas: list[torch.Tensor] | None = None) -> Round:
        """Write round `number`'s Δ (`deltas` where given, else from the weights now) into the buckets and send
        them (on `thread` where given); `undoable`: keep what `abort` needs."""
        global_params = weights.global_params
        flats = [delta.clone() for delta in deltas] if deltas is not None else self.deltas(weights)
        own = [flat.clone() for flat in flats] if weights.carry else None

        def send() -> tuple[list[torch.Tensor], int, list[Pending]]:
            sent, kept = 0, []
            for bucket, flat in zip(self.buckets, flats):
                members = [global_params[i] for i in bucket.members]
                view = driver.view(bucket.index, members, offsets_of(members), bucket.numel)
                pending = driver.prepare(flat, view, lane="comm", undoable=undoable)
                sent += driver.complete(pending).bytes_sent
                kept += [pending] if undoable else []
            return flats, sent, kept

        if thread is None:
            future: Future = Future()
            future.set_result(send())
        else:
            future = thread.submit(send)
        flight = self.flights[number] = Round(self.index, number, flats, future, own=own)
        return flight

    def landed(self, number: int, means: list[torch.Tensor], own: list[torch.Tensor] | None = None) -> Round:
        """Round `number` restored from a checkpoint: its exchange done, its means `means` (`own`: this rank's Δ)."""
        flats = [torch.as_tensor(mean, device=self.device).clone() for mean in means]
        own = [torch.as_tensor(delta, device=self.device).clone() for delta in own] if own is not None else None
        flight = self.flights[number] = Round(self.index, number, flats, means=flats, own=own)
        return flight

    def pop(self, number: int) -> Round:
        """Round `number`, waited for and no longer in flight."""
        flight = self.flights.pop(number)
        flight.wait()
        return flight

    def commit(self, flight: Round, weights: Weights, average: bool = False) -> None:
        """The round's mean Δ steps the fragment's global parameters with the outer optimizer (`average`: θ_global −
        mean Δ, the workers' mean); the local ones become them (α: that share of the local ones kept; `carry`: plus
        what the inner steps since the round started moved them)."""
        params, global_params = weights.params, weights.global_params
        with torch.no_grad():
            saved_grads = [p.grad for p in params]
            local = {i: params[i].detach().clone() for i in self.members}
            if flight.own is not None:  # carried (kept only then): the steps in flight, θ_local − (θ_global − own)
                for bucket, own in zip(self.buckets, flight.own):
                    for i, piece in zip(bucket.members, torch.split(own, [params[i].numel() for i in bucket.members])):
                        local[i].sub_(global_params[i]).add_(piece.view_as(params[i]).to(params[i].dtype))
            for p in params:
                p.grad = None
            for bucket, mean in zip(self.buckets, flight.wait()):
                for i, piece in zip(bucket.members, torch.split(mean, [params[i].numel() for i in bucket.members])):
                    params[i].copy_(global_params[i])
                    params[i].grad = piece.view_as(params[i]).to(params[i].dtype)
        if average:
            with torch.no_grad():
                for i in self.members:
                    params[i].sub_(params[i].grad)
        else:
            weights.outer.step()
        with torch.no_grad():
            for i in self.members:
                global_params[i].copy_(params[i])
                if flight.own is not None:
                    params[i].add_(local[i])
                elif weights.mix:
                    params[i].lerp_(local[i], weights.mix)
            for p, grad in zip(params, saved_grads):
                p.grad = grad

    def abort(self, flight: Round, driver: BucketDriver) -> None:
        """Undo what the round's exchange did to the codec's state (its residuals owe what they owed before)."""
        for pending in reversed(flight.pending):
            driver.undo(pending)
