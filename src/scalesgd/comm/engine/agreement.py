"""What every rank must build alike for an exchange to run, and the codec argument it is built from.

Ranks that build different exchanges (another codec, other options, another dense start, bucket plan or allreduce)
post different collectives and wait on each other until the group times out, saying nothing. Both engines describe
what they built and compare it once, as they join their group (`check_ranks_agree`), so every rank raises the same
one-line `RanksDisagree` instead. A codec argument that is not one is refused before any collective
(`codec_from`, `check_settings`).
"""

from __future__ import annotations

import hashlib
from dataclasses import fields, is_dataclass

import torch
import torch.distributed as dist

from scalesgd.comm.codecs import CODECS, Codec, CodecSettings, make_codec
from scalesgd.comm.engine.buckets import BucketPlan
from scalesgd.registry import UnknownName

SHOWN_AT_MOST = 8  # numbers listed in a message; beyond, the first and last few


class RanksDisagree(ValueError):
    """Ranks built different exchanges: raised alike on every rank, naming what differs and each side's value."""


# ---- the arguments ---------------------------------------------------------------------------------------------
def codec_from(codec, settings: CodecSettings | None = None) -> Codec:
    """The codec an engine was given: a `Codec`, or a registered name built with `settings`; anything else is
    refused naming the value and what is accepted."""
    if isinstance(codec, Codec):
        return codec
    if not isinstance(codec, str):
        raise TypeError(f"codec {codec!r}: give a registered codec's name ({_built_names()}) or a Codec instance")
    if codec not in CODECS:
        raise UnknownName(f"unknown codec {codec!r}; choose from {_built_names()}, or pass a Codec instance")
    return make_codec(codec, settings)


def check_settings(settings) -> None:
    """Refuse codec settings that are not a `CodecSettings` (None: the defaults), saying how to build one."""
    if settings is None or isinstance(settings, CodecSettings):
        return
    if isinstance(settings, dict):
        raise TypeError(f"settings {settings!r} is a dict; give a CodecSettings: "
                        f"CodecSettings(options_from_flat({settings!r})), with CodecSettings from scalesgd.comm.codecs "
                        "and options_from_flat (options by flat name: density, fp8_headroom, …) from "
                        "scalesgd.comm.codecs.registry")
    raise TypeError(f"settings {settings!r}: give a CodecSettings (scalesgd.comm.codecs), e.g. "
                    "CodecSettings(TopkOptions(density=0.01))")


def _built_names() -> str:
    return ", ".join(name for name, entry in CODECS.items() if entry.build is not None)


# ---- what every rank must build alike --------------------------------------------------------------------------
def describe_exchange(codec: Codec, dense_steps: int, plan: BucketPlan | None = None,
                      algorithm: str | None = None) -> dict[str, object]:
    """What ranks must agree on, in the order a disagreement is reported: plain values that pickle and compare."""
    described = {"codec": codec.name, "codec's options": describe_codec(codec),
                 "dense start (compress_after)": dense_steps}
    if plan is not None:
        described["bucket plan"] = tuple((sum(plan.tensors[i].numel for i in bucket), tuple(bucket))
                                         for bucket in plan.buckets)
    if algorithm is not None:
        described["algorithm"] = algorithm
    return described


def describe_codec(codec: Codec) -> dict[str, object]:
    """The codec's name and the options it was built with, read from its public attributes (nested option
    dataclasses by field, objects with a name by it; tensors and other state left out)."""
    return {"name": codec.name, **_options(codec)}


def _options(holder, prefix: str = "") -> dict[str, object]:
    items = ((f.name, getattr(holder, f.name)) for f in fields(holder)) if is_dataclass(holder) else \
        vars(holder).items()
    values = {}
    for key, value in items:
        name = prefix + key
        if key.startswith("_") or name == "name":
            continue
        if is_dataclass(value) and not isinstance(value, type):
            values.update(_options(value, f"{name}."))
        elif value is None or isinstance(value, (bool, int, float, str)):
            values[name] = value
        elif isinstance(value, torch.dtype):
            values[name] = str(value).removeprefix("torch.")
        elif isinstance(getattr(value, "name", None), str):  # a codec inside (lowrank's wire), a sparse wire
            values[name] = value.name
    return values


# ---- the check -------------------------------------------------------------------------------------------------
def check_ranks_agree(described: dict[str, object], group) -> None:
    """Compare this rank's description with every other rank's in `group` (collective: one gather of a digest, and
    of the descriptions only where the digests differ); `RanksDisagree` on every rank alike where one differs."""
    if len(set(_gathered(_digest(described), group))) == 1:
        return
    raise RanksDisagree(disagreement(_gathered(described, group), group))


def disagreement(described: list[dict[str, object]], group=None) -> str:
    """The one line that names the first thing rank 0 and the first rank unlike it differ on, and both values."""
    first = described[0]
    other = next(r for r, d in enumerate(described) if _digest(d) != _digest(first))
    aspect = next(key for key in first if repr(first[key]) != repr(described[other].get(key)))
    mine, theirs = _SHOWN.get(aspect, _plainly)(first[aspect], described[other].get(aspect))
    ranks = [dist.get_global_rank(group, r) if group is not None else r for r in (0, other)]
    return (f"ranks disagree on the {aspect}: rank {ranks[0]} built {mine}, rank {ranks[1]} built {theirs}; "
            "every rank must build the same exchange")


def _gathered(value, group) -> list:
    values = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values


def _digest(value) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


# ---- how each side is shown ------------------------------------------------------------------------------------
def _plainly(mine, theirs) -> tuple[str, str]:
    return str(mine), str(theirs)


def _codec_options(mine: dict, theirs: dict) -> tuple[str, str]:
    """Each codec by name with the options that differ (the names are the same: the codec was compared first)."""
    differ = [key for key in {**mine, **theirs} if repr(mine.get(key)) != repr(theirs.get(key))]
    return tuple(f"{side['name']} ({', '.join(f'{key} {side.get(key)}' for key in differ)})"
                 for side in (mine, theirs))


def _dense_steps(mine: int, theirs: int) -> tuple[str, str]:
    return f"{mine} dense steps", f"{theirs} dense steps"


def _plans(mine: tuple, theirs: tuple) -> tuple[str, str]:
    """The bucket counts and sizes where they differ, else the first bucket that differs and its parameters."""
    if len(mine) != len(theirs):
        return tuple(f"{len(plan)} bucket{'s' if len(plan) != 1 else ''} of {_listed([n for n, _ in plan])} elements"
                     for plan in (mine, theirs))
    b = next(b for b, (ours, others) in enumerate(zip(mine, theirs)) if ours != others)
    return tuple(f"bucket {b} of {plan[b][0]} elements (parameters {_listed(plan[b][1])})" for plan in (mine, theirs))


def _listed(numbers) -> str:
    numbers = list(numbers)
    if len(numbers) <= SHOWN_AT_MOST:
        return ", ".join(map(str, numbers))
    return f"{', '.join(map(str, numbers[:SHOWN_AT_MOST - 2]))}, …, {numbers[-1]} ({len(numbers)} in all)"


_SHOWN = {"codec's options": _codec_options, "dense start (compress_after)": _dense_steps, "bucket plan": _plans}
