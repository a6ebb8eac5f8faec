"""Exchange modes by name, as `bench train` runs them and `simulate` predicts them: `none`, `ddp[-CODEC[@RANK]]`,
`scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]]`, sharded `scalesgd-fsdp[:node][-CODEC[@AMOUNT][/WIRE]]`
(ours; `fsdp…`, its earlier name, still read) and `fsdp2[:node][-CODEC]` (FSDP2 as it comes), periodic
`periodic@H[/F[/τ]][-CODEC]`. AMOUNT is a sparse codec's density or a low-rank codec's
rank; WIRE the low-rank codec's factor wire, or how a sparse codec's entries travel (compact or plain)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from scalesgd.comm.codecs import CODECS, CodecOptions
from scalesgd.comm.codecs.registry import (
    codec_option,
    flat_codec_options,
    options_from_flat,
)
from scalesgd.comm.engine.exchange import RENAMED, SHARDED, engine_named, exchange_names, parse_exchange
from scalesgd.config import AUTO_CODECS, NO_PLANNER
from scalesgd.errors import UsageError
from scalesgd.periodic.schedule import Schedule

MODES_HELP = ("comma-separated: none (no exchange: the compute-only bound), ddp[-CODEC[@RANK]], "
              "periodic@H[/F[/τ]][-CODEC] (simulate: synchronisation every H steps, F fragments, τ steps behind), "
              "scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]] (AMOUNT: a sparse codec's density, lowrank's "
              "rank; WIRE: lowrank's factor wire, e.g. scalesgd-lowrank@4/fp16, or a sparse codec's, compact or plain, "
              "e.g. scalesgd-topk@0.01/plain), scalesgd-fsdp[:node][-CODEC[@AMOUNT][/WIRE]] (simulate: ours on FSDP2's "
              "reduce-scatter; :node shards within nodes), fsdp2[:node][-CODEC] (FSDP2's own), "
              "auto[-EXCHANGE+EXCHANGE…[@DENSITY]] "
              "(--exchange auto among those: our codecs by name, ddp and ddp-CODEC; default: --auto-codecs' own)")
AUTO_DEFAULT = "+".join(AUTO_CODECS)
AUTO_AMOUNT = "density"  # what an auto mode's @ sets: the sparse candidates' density


@dataclass(frozen=True)
class Mode:
    """One way to exchange gradients: `none` (no exchange: the compute-only bound), DDP or scalesgd, with the codec
    options it runs with: those its name sets (@AMOUNT, /WIRE) over `base` (a run's own; None: the defaults)."""

    name: str
    engine: str
    codec: str = "fp32"
    algorithm: str = "ring"
    buckets: str = "size:1"
    given: tuple[tuple[str, Any], ...] = ()  # codec options the name sets, by flat name (`rank`, `factor_wire`)
    base: CodecOptions | None = field(default=None, compare=False)
    schedule: Schedule | None = None  # periodic synchronisation's (None: an exchange every step)
    shard: str = ""  # a sharded mode's layout: "" every rank's shard, "node" sharded within nodes, replicated across

    def codec_options(self) -> dict:
        """The training options this mode sets beyond its codec, by flat name: its amount and wire."""
        return dict(self.given)

    @cached_property
    def options(self) -> CodecOptions:
        """Every codec option this mode runs with: what the simulator costs it by (built once: every bucket's
        prediction reads it)."""
        if not self.given and self.base is not None:
            return self.base
        return options_from_flat({**(flat_codec_options(self.base) if self.base is not None else {}),
                                  **dict(self.given)})

    @property
    def warm_start(self) -> int:
        """Iterations this mode exchanges uncompressed before its codec starts, which no timing may include."""
        return CODECS[self.codec].warm_start if self.engine in ("ddp", "scalesgd", *SHARDED) else 0

    @property
    def auto_codecs(self) -> tuple[str, ...]:
        """An `auto` mode's candidate codecs."""
        return tuple(self.codec.split("+")) if self.engine == "auto" else ()

    @property
    def planner(self) -> str:
        return self.buckets.split(":", 1)[1] if self.buckets.startswith("planner:") else NO_PLANNER


def parse_mode(text: str) -> Mode:
    """`none`, `ddp[-CODEC[@RANK]]`, `scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]]`,
    `periodic@H[/F[/τ]][-CODEC]` or `auto[-EXCHANGE+EXCHANGE…][@DENSITY]`; UsageError (a ValueError) naming the
    part that is wrong and what it accepts otherwise. Every part a mode's name shows is a part it runs with: none is
    empty, none ignored.

    BUCKETS may be `planner:dlgs` or `planner:optimal` (profiled and planned at start-up).
    """
    engine, dash, rest = text.partition("-")
    if text == "none":
        return Mode(text, "none")
    if text.startswith("periodic"):
        return _parse_periodic(text)
    if text == "auto" or text.startswith(("auto-", "auto@")):
        return _parse_auto(text)
    if any(text == name or text.startswith((name + ":", name + "-")) for name in _SHARDED_NAMES):
        return _parse_sharded(text)
    if engine not in ("ddp", "scalesgd"):
        raise UsageError(f"mode {text!r} is not known; use none, ddp[-CODEC[@RANK]], "
                         "scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]], periodic@H[/F[/τ]][-CODEC] or "
                         "auto[-EXCHANGE+EXCHANGE…][@DENSITY]")
    codec = _longest_codec(rest)
    if dash and codec is None:
        name = re.split("[-@/]", rest, maxsplit=1)[0]
        what = f"codec {name!r} is not known" if name else "give its codec after the -"
        raise UsageError(f"mode {text!r}: {what}; choose from {', '.join(CODECS)}")
    codec = codec or "fp32"
    amount, tail = _amount(rest[len(codec):])
    wire = None
    if tail.startswith("/"):
        wire, dash, tail = tail[1:].partition("-")
        tail = dash + tail
    # what is left is empty or starts with a dash: the codec, the amount and the wire each end at one
    algorithm, dash, buckets = tail[1:].partition("-")
    if engine == "ddp" and (tail or wire is not None):
        raise UsageError(f"mode {text!r}: a ddp mode is ddp-CODEC[@RANK]; DDP chooses its own algorithm and "
                         "buckets")
    if tail and not algorithm:
        raise UsageError(f"mode {text!r}: give its algorithm after the -, or end the mode before it")
    if dash and not buckets:
        raise UsageError(f"mode {text!r}: give its buckets after the -, or end the mode before it")
    return Mode(text, engine, codec, algorithm or "ring", buckets or "size:1",
                given=_amount_and_wire(text, engine, codec, amount, wire))


_SHARDED_NAMES = sorted([*SHARDED, *RENAMED], key=len, reverse=True)
_SHARDED = re.compile(rf"({'|'.join(map(re.escape, _SHARDED_NAMES))})(?::(node))?(?:-(.+))?$")


def _parse_sharded(text: str) -> Mode:
    """`scalesgd-fsdp[:node][-CODEC[@AMOUNT][/WIRE]]` (ours) or `fsdp2[:node][-CODEC]` (FSDP2's own reduce-scatter in
    the codec's dtype): every rank's shard, or (`:node`) shards within each node and the sum across nodes."""
    found = _SHARDED.match(text)
    if not found:
        raise UsageError(f"mode {text!r}: a sharded mode is scalesgd-fsdp[:node][-CODEC[@AMOUNT][/WIRE]] or "
                         "fsdp2[:node][-CODEC], e.g. scalesgd-fsdp-fp8 or scalesgd-fsdp:node-topk@0.01")
    engine, shard, rest = engine_named(found[1]), found[2] or "", found[3] or "fp32"
    codec = _longest_codec(rest)
    if codec is None or not CODECS[codec].runs_on(engine):
        takes = [c for c, e in CODECS.items() if e.runs_on(engine)]
        name = codec or re.split("[-@/]", rest, maxsplit=1)[0]
        raise UsageError(f"mode {text!r}: codec {name!r} does not run on {engine}; choose from {', '.join(takes)}")
    amount, tail = _amount(rest[len(codec):])
    wire = None
    if tail.startswith("/"):
        wire, tail = tail[1:], ""
    if tail:
        raise UsageError(f"mode {text!r}: a sharded mode's units are its buckets; end it after the codec's "
                         "@AMOUNT or /WIRE")
    return Mode(text, engine, codec, "ring", "units", given=_amount_and_wire(text, "scalesgd", codec, amount, wire),
                shard=shard)


_AMOUNT = re.compile(r"@(-?(?:[^-/]|(?<=[0-9.][eE])-(?=[0-9]))*)")  # @0.01, @-1 (refused by its check), @1e-05


def _longest_codec(rest: str) -> str | None:
    """The codec a mode's name starts `rest` with: the longest that fits (names hold dashes: fp8-direct)."""
    fits = [c for c in CODECS if rest == c or rest.startswith((c + "-", c + "@", c + "/"))]
    return max(fits, key=len) if fits else None


def _amount(tail: str) -> tuple[str | None, str]:
    """A leading @AMOUNT (to the next / or dash that is neither its sign nor its exponent's) and what follows it."""
    if not tail.startswith("@"):
        return None, tail
    found = _AMOUNT.match(tail)
    return found[1], tail[found.end():]


def _parse_auto(text: str) -> Mode:
    """`auto[-EXCHANGE+EXCHANGE…][@DENSITY]`: `--exchange auto` among those exchanges (default: `--auto-codecs`'
    own); DENSITY sets the sparse candidates' density, so one of them must be sparse."""
    body = text[len("auto-"):] if text.startswith("auto-") else AUTO_DEFAULT + text[len("auto"):]
    names, at, amount = body.partition("@")
    known = exchange_names()
    for name in names.split("+"):
        if name not in known:
            what = f"exchange {name!r} is not known" if name else (
                "give its exchanges after the -" if not names else f"an exchange is missing in {names!r}")
            raise UsageError(f"mode {text!r}: {what}; choose from {', '.join(known)}")
    given = _given(text, {AUTO_AMOUNT: amount} if at else {})
    takes = [name for name in known if CODECS[parse_exchange(name)[1]].amount == AUTO_AMOUNT]
    if at and not any(name in takes for name in names.split("+")):
        raise UsageError(f"mode {text!r}: @{AUTO_AMOUNT.upper()} sets the {AUTO_AMOUNT} of its sparse exchanges and "
                         f"it has none; {', '.join(takes)} take one")
    return Mode(text, "auto", names, given=given)


def _parse_periodic(text: str) -> Mode:
    """`periodic@H[/F[/τ]][-CODEC]`: periodic synchronisation every H steps (Streaming DiLoCo with F fragments, each
    exchange behind τ steps), the pseudo-gradient through CODEC (fp32 by default), whole: no @AMOUNT or /WIRE."""
    shape, _, codec = text[len("periodic@"):].partition("-") if text.startswith("periodic@") else ("", "", "")
    try:
        schedule = Schedule.parse(shape)
    except (TypeError, ValueError) as err:
        raise UsageError(f"mode {text!r}: a periodic mode is periodic@H[/F[/τ]][-CODEC], e.g. periodic@50-fp8 or "
                         f"periodic@50/5/1-fp8 ({err})") from None
    codec = codec or "fp32"
    ours = [c for c, e in CODECS.items() if e.build is not None]
    if codec not in ours:
        name = re.split("[@/]", codec, maxsplit=1)[0]
        if name in ours:
            raise UsageError(f"mode {text!r}: a periodic mode's codec takes no @AMOUNT or /WIRE (its pseudo-gradient "
                             f"runs at the codec's own options): give periodic@{shape}-{name}")
        raise UsageError(f"mode {text!r}: codec {codec!r} is none of ours; choose from {', '.join(ours)}")
    return Mode(text, "periodic", codec, schedule=schedule)


def _amount_and_wire(text: str, engine: str, codec: str, amount: str | None, wire: str | None) -> dict:
    """The options a mode's @AMOUNT and /WIRE set, as its codec's registration names them, checked as the options
    themselves are (UsageError naming the mode)."""
    entry = CODECS[codec]
    if amount is not None and entry.amount is None:
        takes = [name for name, e in CODECS.items() if e.amount is not None and e.runs_on(engine)]
        raise UsageError(f"mode {text!r}: {codec} takes no @AMOUNT; under {engine} {', '.join(takes)} take one")
    if wire is not None and (entry.wire_option is None or engine == "ddp"):
        takes = [name for name, e in CODECS.items() if e.wire_option is not None and e.runs_on("scalesgd")]
        raise UsageError(f"mode {text!r}: {codec} takes no /WIRE; {', '.join(takes)} take one")
    return _given(text, {**({entry.amount: amount} if amount is not None else {}),
                         **({entry.wire_option: wire} if wire is not None else {})})


def _given(text: str, values: dict[str, str]) -> tuple[tuple[str, Any], ...]:
    """Option values given as text, parsed and checked by their own declarations, by flat name."""
    parsed = {}
    for name, value in values.items():
        flat = codec_option(name)
        parse = flat.field.metadata["parse"] or type(flat.field.default)
        if not value:
            raise UsageError(f"mode {text!r}: give its {name} after the {'/' if name.endswith('wire') else '@'}")
        try:
            parsed[name] = parse(value)
        except ValueError:
            kind = "a whole number" if isinstance(flat.field.default, int) else "a number"
            raise UsageError(f"mode {text!r}: {name} {value!r} is not {kind}") from None
    try:
        options_from_flat(parsed)
    except UsageError as err:
        raise UsageError(f"mode {text!r}: {str(err).replace('`', '')}") from None
    return tuple(parsed.items())
