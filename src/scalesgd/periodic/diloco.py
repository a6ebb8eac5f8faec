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

With fp16's `torch.amp.GradScaler`, give it (`scaler=`): a step it skips on one rank is still a step of the round
there, so every rank's rounds stay together. A lossy codec's state (top-k's residuals, fp8's ranges) is kept across
rounds by parameter, as on the per-step engine, so what a round did not send is owed in the next.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from scalesgd.comm.codecs import Codec, CodecSettings
from scalesgd.comm.codecs.registry import entry_of
from scalesgd.comm.engine.agreement import check_ranks_agree, check_settings, codec_from
from scalesgd.comm.engine.driver import BucketDriver, open_channel
from scalesgd.comm.wire.groups import own_group
from scalesgd.comm.wire.membership import Membership
from scalesgd.elastic.threads import DaemonThreads
from scalesgd.periodic.elastic_rounds import ElasticRounds
from scalesgd.periodic.fragments import split
from scalesgd.periodic.outer import OUTER_LR, OUTER_MOMENTUM, outer_sgd
from scalesgd.periodic.rounds import Fragment, Round, Weights
from scalesgd.periodic.schedule import Schedule

BUCKET_MB = 4  # a pseudo-gradient's buckets: few, large messages (it travels once a round, not behind backward)


class DiLoCo:
    """Synchronise `model` every `local_steps` steps (or on a `Schedule`'s) of `inner_optimizer` (a hook on its
    `step`, or on `scaler`'s
    `update` where one is given, while the context is entered; or `after_inner_step()` called by the loop): the
    pseudo-gradient through `codec` (a registered name or a `Codec`), the global parameters stepped by
    `outer_optimizer` (an optimizer built over the model's parameters, or a function building it over the parameters
    given; by default DiLoCo's Nesterov SGD, lr 0.7, momentum 0.9, or the codec's recipe: SparseLoCo averages).

    A model sharded by FSDP2 within each node (`comm.engine.fsdp.shard_model` on the node's mesh) synchronises its
    shards: each rank's pseudo-gradient is its shards', exchanged in `group` among the ranks that hold the same ones
    (the cross-node group), and the outer optimizer steps the shards (give it as a function).

    `fragments`: the number of fragments of whole layers, or the fragments as lists of parameters (every trainable
    parameter in one); `overlap_steps` (τ): inner steps a fragment's exchange runs behind on the communication thread
    before it lands; `mix` (α): the share of the local parameters kept where a fragment lands (0: the global ones alone,
    as DiLoCo); `carry`: instead, the τ inner steps taken while it was in flight are added to the new global parameters,
    so none is lost to the overlap. `group`: the replicas, a process group or a `Membership` (default: a new group of
    every rank); a round commits where the membership says so. Every rank builds it together and starts from rank 0's
    parameters. An `ElasticMembership` (`scalesgd.elastic`) takes each round among whoever is alive (one fragment, no
    overlap, a codec a worker may join: each member's residuals are its own, a joiner's start at zero): a worker joining
    later heals from a peer as it is built. `resume`: a `state_dict()` to start from (an elastic member's before it
    joins, with the caller's `shared` counters)."""

    def __init__(self, model: nn.Module, inner_optimizer: torch.optim.Optimizer, local_steps: int | Schedule, *,
                 outer_optimizer: torch.optim.Optimizer | Callable | None = None, codec: str | Codec = "fp32",
                 settings: CodecSettings | None = None, fragments: int | list[list[nn.Parameter]] = 1,
                 overlap_steps: int = 0, mix: float = 0.0, carry: bool = False, group=None, topology=None,
                 scaler: torch.amp.GradScaler | None = None, buckets_mb: float = BUCKET_MB, delay: int | None = None,
                 resume: dict | None = None):
        if delay is not None:
            warnings.warn("DiLoCo(delay=…) is now overlap_steps=… (the --overlap-steps option's name)",
                          DeprecationWarning, stacklevel=2)
            overlap_steps = delay
        _check_arguments(model, inner_optimizer, mix, scaler, buckets_mb)
        if isinstance(local_steps, Schedule):  # the whole schedule given: its fragments and overlap are its own
            if fragments != 1 or overlap_steps:
                raise ValueError("fragments and overlap_steps come with the Schedule given as local_steps: give "
                                 "them there, or give local_steps as a number")
            local_steps, fragments, overlap_steps = (local_steps.local_steps, local_steps.fragments,
                                                     local_steps.overlap_steps)
        _check_carry(carry, overlap_steps, mix)
        parts = _fragments(model, fragments, local_steps, overlap_steps)
        self.schedule = Schedule(local_steps, len(parts), overlap_steps)
        self.model, self.inner, self.scaler = model, inner_optimizer, scaler
        with torch.no_grad():
            params = [_own(p) for part in parts for p in part]  # what this rank holds of each
        check_settings(settings)
        self.codec = codec_from(codec, (settings or CodecSettings()).but(local_steps=local_steps))
        outer = _outer(outer_optimizer, params, model, self.codec)
        self.driver = BucketDriver(self.codec, None)
        with torch.no_grad():
            self.weights = Weights(params, [p.detach().clone() for p in params], outer, mix, carry)
        self.driver.bind(self.weights.global_params)
        index = {id(p): i for i, p in enumerate(p for part in parts for p in part)}
        self.fragments: list[Fragment] = []
        for f, part in enumerate(parts):
            first = sum(len(fragment.buckets) for fragment in self.fragments)
            self.fragments.append(Fragment.plan(f, [index[id(p)] for p in part], params, self.driver, buckets_mb,
                                                first))
        described = (f"periodic {self.codec.name} H={local_steps} F={len(parts)} τ={overlap_steps} α={mix} "
                     f"carry={carry} "
                     f"params={[tuple(p.shape) for p in params]}")
        self.steps = 0  # inner steps taken
        self.rounds = 0  # rounds committed (one fragment's each)
        self.bytes_sent = 0
        elastic = getattr(group, "elastic", None)
        self._thread = (DaemonThreads() if elastic is not None else
                        ThreadPoolExecutor(1, thread_name_prefix="scalesgd-periodic") if overlap_steps > 0 else None)
        self._hook = None
        self.elastic: ElasticRounds | None = None
        if elastic is not None:  # members come and go: the first quorum, and a peer's state where behind
            if len(parts) > 1 or overlap_steps:
                raise ValueError("elastic rounds (an ElasticMembership as group) take one fragment and "
                                 f"overlap_steps 0: give local_steps alone, not {self.schedule.name}")
            if self.codec.shared_state_dict() is None:
                raise ValueError(f"codec {self.codec.name}: elastic rounds take a codec whose state splits into what "
                                 "every member shares and each one's own residuals (every codec of ours but onebit, "
                                 "whose errors belong to a fixed world)")
            self.members = group
            elastic.config = f"{elastic.config} | {described}"
            self.elastic = ElasticRounds(self)
            if resume is not None:
                self.elastic.restore(resume)
            self.elastic.join()
            return
        # collectives from here on: every rank builds it together
        self.members = group if isinstance(group, Membership) else Membership(group if group is not None
                                                                              else own_group())
        check_ranks_agree(described, self.members.group)
        self.driver.channel = open_channel(self.codec, self.members.group, topology)
        self._broadcast_start()
        if resume is not None:
            self.load_state_dict(resume)

    # ---- what it holds ---------------------------------------------------------------------------------
    @property
    def params(self) -> list[torch.Tensor]:
        """This rank's parameters (a shard's where sharded), in the fragments' order: what the inner optimizer steps."""
        return self.weights.params

    @property
    def global_params(self) -> list[torch.Tensor]:
        """This rank's copy of the global parameters (the same on every rank after each round)."""
        return self.weights.global_params

    @property
    def outer(self) -> torch.optim.Optimizer:
        return self.weights.outer

    @property
    def in_flight(self) -> list[tuple[int, int]]:
        """The (fragment, round) of every exchange under way, in order."""
        return sorted(flight.key for fragment in self.fragments for flight in fragment.flights.values())

    # ---- the user's loop -------------------------------------------------------------------------
    def __enter__(self) -> DiLoCo:
        if self.scaler is not None:  # every iteration updates the scale, whether or not the optimizer stepped
            update = self.scaler.update

            def counted(*args, **kwargs):
                update(*args, **kwargs)
                self.after_inner_step()

            self.scaler.update = counted
            self._hook = update
        else:
            self._hook = self.inner.register_step_post_hook(lambda *_: self.after_inner_step())
        return self

    def __exit__(self, *exc) -> bool:
        if self.scaler is not None and self._hook is not None:
            self.scaler.update = self._hook
        elif self._hook is not None:
            self._hook.remove()
        self._hook = None
        if self._thread is not None:
            self._thread.shutdown(wait=exc[0] is None)
        return False

    def after_inner_step(self) -> None:
        """Count an inner step; start the exchange of the fragment whose turn it is and land the one that is due."""
        self.steps += 1
        started = self.schedule.starts(self.steps)
        if self.elastic is not None:  # a slower member's round ends after the fewer steps planned for it
            if self.elastic.stepped():
                self.elastic.round(self.fragments[0])
            return
        if started is not None:
            self._start(self.fragments[started], self.schedule.round_of(self.steps + self.schedule.overlap_steps))
        landed = self.schedule.lands(self.steps)
        if landed is not None:
            self._land(self.fragments[landed].pop(self.schedule.round_of(self.steps)))

    def finish(self) -> None:
        """Land the exchanges under way, then average every fragment whose last round was cut short by the end of
        training into the global parameters (outer SGD at lr 1 without momentum: the outer momentum, built on whole
        rounds, would carry a few steps' pseudo-gradient too far), so every rank holds them (collective)."""
        if self.elastic is not None:
            if self.steps % self.schedule.local_steps:
                self.elastic.round(self.fragments[0], average=True)
            self._copy(self.global_params, self.params)
            return
        for fragment, number in self.in_flight:
            self._land(self.fragments[fragment].pop(number))
        if self.steps % self.schedule.local_steps or self.schedule.fragments > 1:
            last = self.schedule.round_of(self.steps) + 1
            for fragment in self.fragments:
                self._start(fragment, last)
                self._land(fragment.pop(last), average=True)
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

    # ---- one round -------------------------------------------------------------------------------
    def _start(self, fragment: Fragment, number: int) -> None:
        fragment.start(number, self.weights, self.driver, self._thread, self.members.may_abort)

    def _land(self, flight: Round, average: bool = False) -> None:
        """The round commits where the membership takes it (the outer step; `average`: the workers' mean), else it
        is aborted (the codec's work undone, the global parameters as they were)."""
        fragment = self.fragments[flight.fragment]
        self.bytes_sent += flight.bytes_sent
        if self.members.should_commit():
            fragment.commit(flight, self.weights, average)
            self.rounds += 1
        else:
            fragment.abort(flight, self.driver)

    # ---- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state (collective where an exchange is under way: it lands in the state): the step in the
        round, the global parameters, the outer optimizer's, the codec's (in elastic rounds what every member shares,
        its residuals left out) and the means of the exchanges not yet merged, by fragment and round; the local
        parameters and the inner optimizer's state are the caller's."""
        inflight = [{"fragment": f, "round": r, "means": [m.clone() for m in flight.wait()],
                     **({"own": [d.clone() for d in flight.own]} if flight.own is not None else {})}
                    for f, r in self.in_flight for flight in [self.fragments[f].flights[r]]]
        return {"steps": self.steps, "rounds": self.rounds, "bytes_sent": self.bytes_sent,
                "global": [p.clone() for p in self.global_params], "outer": self.outer.state_dict(),
                "codec": self.driver.state_dict() if self.elastic is None else self.driver.shared_state_dict(),
                "inflight": inflight}

    def load_state_dict(self, state: dict) -> None:
        self.steps, self.rounds, self.bytes_sent = state["steps"], state["rounds"], state["bytes_sent"]
        self._copy(state["global"], self.global_params)
        self.outer.load_state_dict(state["outer"])
        self.driver.load_state_dict(state["codec"])
        inflight = state["inflight"]
        if isinstance(inflight, dict):  # an earlier version's, by fragment alone: each lands at its next landing
            inflight = [{"fragment": f, "round": self._next_round(f), "means": means} for f, means in inflight.items()]
        for flight in inflight:
            self.fragments[flight["fragment"]].landed(flight["round"], flight["means"], flight.get("own"))

    # ---- helpers ---------------------------------------------------------------------------------
    def _next_round(self, fragment: int) -> int:
        """The round of `fragment`'s next landing after the steps taken."""
        s = self.schedule
        k = max(0, (self.steps // s.period - fragment - 1) // s.fragments + 1)
        return s.round_of((k * s.fragments + fragment + 1) * s.period)

    def _broadcast_start(self) -> None:
        """Every rank starts from rank 0's parameters (local and global)."""
        for p, g in zip(self.params, self.global_params):
            self.members.broadcast(g)
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


def _check_arguments(model, inner, mix, scaler, buckets_mb) -> None:
    """Refuse, naming the argument, what would train without synchronising (before any collective)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model {type(model).__name__}: give the nn.Module each worker trains")
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(f"inner_optimizer {type(inner).__name__}: give the torch optimizer each worker steps")
    if isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix {mix!r}: give 0 to 1 (the share of the local parameters kept where a fragment lands)")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler {type(scaler).__name__}: give the torch.amp.GradScaler the loop steps with")
    if isinstance(buckets_mb, bool) or not isinstance(buckets_mb, (int, float)) or not buckets_mb > 0:
        raise ValueError(f"buckets_mb {buckets_mb!r}: give a size in MB above 0")
    stepped = {id(p) for group in inner.param_groups for p in group["params"]}
    if not stepped <= {id(p) for p in model.parameters()}:
        raise ValueError("inner_optimizer steps parameters that are not `model`'s: build it over "
                         "model.parameters() (of this model, after any sharding)")


def _check_carry(carry, overlap_steps, mix) -> None:
    """`carry` moves the steps taken while a round is in flight: there must be some, and α must not move them too."""
    if not isinstance(carry, bool):
        raise TypeError(f"carry {carry!r}: give True or False")
    if carry and not overlap_steps:
        raise ValueError("carry True: give overlap_steps 1 or more (carry keeps the inner steps taken while a round "
                         "is in flight; with none in flight there is nothing to carry)")
    if carry and mix:
        raise ValueError(f"carry True with mix {mix!r}: give one (carry adds the steps in flight to the new global "
                         "parameters; mix keeps a share of the local ones instead)")


def _fragments(model: nn.Module, fragments, local_steps, overlap_steps) -> list[list[nn.Parameter]]:
    """The fragments as lists of parameters, every trainable parameter in one (ValueError/TypeError naming
    `fragments`, or the schedule's argument that is wrong)."""
    if isinstance(fragments, int) and not isinstance(fragments, bool):
        Schedule(local_steps, fragments, overlap_steps)  # the schedule's own message first
        return split(model, fragments)
    if not isinstance(fragments, (list, tuple)) or not all(isinstance(f, (list, tuple)) for f in fragments):
        raise TypeError(f"fragments {type(fragments).__name__}: give a number of fragments of whole layers, or the "
                        "fragments as lists of the model's parameters")
    parts = [list(f) for f in fragments]
    given = [id(p) for part in parts for p in part]
    trained = [id(p) for p in model.parameters() if p.requires_grad]
    if not parts or not all(parts):
        raise ValueError("fragments: give lists of parameters, none empty")
    if len(set(given)) != len(given) or set(given) != set(trained):
        missing, extra = len(set(trained) - set(given)), len(set(given) - set(trained))
        raise ValueError(f"fragments: give each of the model's {len(trained)} trainable parameters in exactly one "
                         f"fragment ({missing} left out, {extra} not the model's trainable ones, "
                         f"{len(given) - len(set(given))} repeated)")
    return parts


def _outer(outer_optimizer, params: list[torch.Tensor], model: nn.Module, codec: Codec) -> torch.optim.Optimizer:
    """The outer optimizer over this rank's parameters: built here (by default DiLoCo's, at the codec's recipe where
    it brings one: SparseLoCo's plain averaging), or as given where it steps the model's own."""
    if outer_optimizer is None:
        recipe = entry.recipe if (entry := entry_of(codec)) is not None else {}
        return outer_sgd(params, recipe.get("outer_lr", OUTER_LR), recipe.get("outer_momentum", OUTER_MOMENTUM))
    if callable(outer_optimizer) and not isinstance(outer_optimizer, torch.optim.Optimizer):
        return outer_optimizer(params)
    if not isinstance(outer_optimizer, torch.optim.Optimizer):
        raise TypeError(f"outer_optimizer {type(outer_optimizer).__name__}: give a torch optimizer over the model's "
                        "parameters, or a function building one over the parameters it is given")
    stepped = {id(p) for group in outer_optimizer.param_groups for p in group["params"]}
    if not {id(p) for p in params} <= stepped <= {id(p) for p in model.parameters()}:
        raise ValueError("outer_optimizer must step exactly the model's trainable parameters (it steps the global "
                         "ones with the mean pseudo-gradient); build it over model.parameters(), or give a function "
                         "that builds it over the parameters it is given")
    return outer_optimizer
