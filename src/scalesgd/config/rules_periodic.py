"""The rules of periodic synchronisation between `scalesgd train`'s options (`local_steps` and what goes with it):
what needs an exchange every step is refused, the schedule is the `Schedule`'s to validate, its fragments the model's
layers, and torchft's DiLoCo has its own needs."""

from __future__ import annotations

import importlib.util
import re

import torch

from scalesgd import checks
from scalesgd.comm.codecs import CODECS
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.cost.planner import NO_PLANNER
from scalesgd.elastic.coordinator import Address
from scalesgd.errors import UsageError
from scalesgd.models import build_model
from scalesgd.options import (
    field_default,
    flat_options,
    flatten,
    own_and_set,
    require_choice,
)
from scalesgd.periodic.fragments import layers

SCHEDULE_OPTIONS = ("local_steps", "fragments", "overlap_steps")


def periodic(cfg) -> None:
    """`local_steps`: a codec of ours carries the pseudo-gradient; what needs an exchange every step is refused;
    the fragments divide a round and their exchanges land before their next one starts."""
    r, x, p = cfg.recipe, cfg.exchange, cfg.periodic
    if x.auto:
        raise UsageError(f"`exchange` auto chooses how the run exchanges, periodic synchronisation among its "
                         f"choices (where bench quality measured it): drop `local_steps` {p.local_steps}, or drop "
                         "`exchange` auto and give `codec` (the pseudo-gradient's)")
    ours = [name for name, entry in CODECS.items() if entry.build is not None]
    require_choice("codec", x.codec, ours, " (with `local_steps`: the pseudo-gradient travels through our codecs)")
    per_step = {"compress_after": x.compress_after != field_default(type(x), "compress_after"),
                # an optimizer that steps with its codec's exchange (1-bit Adam's)
                "optimizer": any(entry.optimizer == r.optimizer for entry in CODECS.values()),
                "momentum_correction": x.momentum_in_exchange,
                "freeze_variance": r.freeze_variance, "noise_scale": cfg.output.noise_scale,
                "lr_scaling": r.lr_scaling == "adascale", "planner": x.planner != NO_PLANNER}
    for name, on in per_step.items():
        if on:
            raise UsageError(f"`{name}` {flatten(cfg)[name]} needs the gradients exchanged every step; with "
                             f"`local_steps` {p.local_steps} each worker steps alone between synchronisations")
    entry = x.codec_entry
    if entry.beta1_option is not None and flatten(cfg)[entry.beta1_option] != 0:
        raise UsageError(f"`codec` {x.codec} with `local_steps` sends the pseudo-gradient's signs: give "
                         f"`{entry.beta1_option}` 0 (the outer optimizer keeps the momentum)")
    if p.peer == "torchft":
        torchft_peer(cfg)
    elif p.peer_bucket_mb:
        raise UsageError(f"`peer_bucket_mb` {p.peer_bucket_mb:g} sizes torchft's buckets: add `peer` torchft")
    if p.elastic or p.join:
        elastic(cfg)
    elif p.elastic_grace:
        raise UsageError(f"`elastic_grace` {p.elastic_grace:g} is the grace window of an `elastic` run's rounds: add "
                         "`elastic`")
    try:
        schedule = p.schedule
    except (TypeError, ValueError) as err:
        raise UsageError(_named(str(err), SCHEDULE_OPTIONS)) from None
    carry(p, schedule)
    if schedule.fragments > 1:
        with torch.device("meta"):  # the model's layers, nothing allocated
            model = build_model(cfg.model.name, 2, 3, cfg.model.options)
        problem = schedule.fits(len(layers(model)))
        if problem:
            raise UsageError(_named(f"{problem} ({cfg.model.name})", SCHEDULE_OPTIONS))
    for name in ("algorithm", "buckets"):
        if getattr(x, name) != field_default(type(x), name):
            raise UsageError(f"`{name}` {getattr(x, name)} shapes a per-step exchange; with `local_steps` the "
                             "pseudo-gradient travels on a ring in buckets of its codec's: drop it")
    values = flatten(cfg)
    for flat in flat_options(type(cfg)):  # another family's own option: nothing would read it
        if own_and_set(flat, values) and flat.prefix != x.codec_entry.family:
            raise UsageError(f"`{flat.name}` applies to the {flat.prefix} codecs; with `local_steps` the "
                             f"pseudo-gradient travels through `codec` {x.codec}")


def carry(p, schedule) -> None:
    """`carry` moves the inner steps taken while an exchange is in flight: our DiLoCo's, with overlap and no α."""
    if not p.carry:
        return
    if not schedule.overlap_steps:
        raise UsageError("`carry` keeps the inner steps taken while a round's exchange is in flight: add "
                         "`overlap_steps` τ (1 or more), or drop `carry`")
    if p.mix:
        raise UsageError(f"`carry` with `mix` {p.mix:g}: give one (carry adds the steps in flight to the new global "
                         "parameters; mix keeps a share of the local ones instead)")
    if p.peer:
        raise UsageError(f"`carry` is our DiLoCo's; `peer` {p.peer} lands a fragment with `mix` alone: drop one")


def _named(text: str, names: tuple[str, ...]) -> str:
    """A library message in the command line's terms: the options it names in backticks (shown as --flags)."""
    return re.sub(rf"\b({'|'.join(names)})\b", r"`\1`", text)


def torchft_peer(cfg) -> None:
    """torchft's DiLoCo: installed, its pseudo-gradient in fp32 (its quantized path needs Triton on a GPU), one
    process per replica group (a worker's Manager is its own group)."""
    if importlib.util.find_spec("torchft") is None:
        raise UsageError("`peer` torchft needs the torchft package: pip install 'scalesgd[peers]'")
    if cfg.exchange.codec != DENSE.name:
        raise UsageError(f"`peer` torchft sends fp32 pseudo-gradients (its quantized allreduce needs Triton on a "
                         f"GPU): give `codec` {DENSE.name}, not {cfg.exchange.codec}")
    if cfg.runtime.max_restarts:
        raise UsageError("`peer` torchft recovers through its own Manager, not our restarts: give `max_restarts` 0")


ELASTIC_DATASETS_REFUSED = ("imagefolder",)  # streamed by loader processes in a fixed order per epoch


def elastic(cfg) -> None:
    """Rounds among whoever is alive: one fragment without overlap, a codec a worker may join (`joinable`), data
    held in memory, and the options a member can decide alone (nothing the loop would share between rounds)."""

    p, x = cfg.periodic, cfg.exchange
    if checks.launched() and not p.join:
        raise UsageError("`elastic` under torchrun: give every host's launch `join` ADDRESS, the address the run's "
                         "coordinator printed (`python -m scalesgd.elastic`, or a first `scalesgd train --elastic` "
                         "outside torchrun); each process is then one member")
    if p.join:
        try:
            Address.parse(p.join)
        except ValueError as err:
            raise UsageError(f"`join` {err}") from None
    elif p.min_workers > cfg.runtime.workers:
        raise UsageError(f"`min_workers` {p.min_workers} is above `workers` {cfg.runtime.workers}: a round could never "
                         "have that many; give at most the workers started")
    if importlib.util.find_spec("torchft") is None:
        raise UsageError("`elastic` needs torchft's lighthouse for its members: pip install 'scalesgd[peers]'")
    for name, given in (("fragments", p.fragments > 1), ("overlap_steps", p.overlap_steps)):
        if given:
            raise UsageError(f"`elastic` takes one fragment and no overlap: drop `{name}` {getattr(p, name)}")
    if not x.codec_entry.joinable:
        raise UsageError(f"`codec` {x.codec}'s state belongs to a fixed set of workers: with `elastic` give one a "
                         "worker may join (fp32, fp16, bf16, fp8, topk, lowrank, …)")
    if p.peer or cfg.replica_scope == "node":
        raise UsageError("`elastic` runs our DiLoCo with one process a worker: drop `peer` and `replica` node")
    if cfg.data.dataset in ELASTIC_DATASETS_REFUSED:
        raise UsageError(f"`dataset` {cfg.data.dataset} is streamed from files in a fixed order per epoch; `elastic` "
                         "deals samples to whoever is alive each round from data held in memory: give another dataset")
    o = cfg.output
    for name, given in (("time_budget", o.time_budget), ("trace", o.trace)):
        if given:
            raise UsageError(f"`{name}` {given} is decided across the workers every step; with `elastic` each worker "
                             "steps alone between rounds: drop it")
    if o.checkpoint_every != field_default(type(o), "checkpoint_every"):
        raise UsageError(f"`checkpoint_every` {o.checkpoint_every}: an `elastic` run checkpoints its global state at "
                         "each epoch's end, where the round's first member runs; drop it")
