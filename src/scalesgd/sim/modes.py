"""Exchange modes by name, as `bench train` runs them and `simulate` predicts them: `none`, `ddp[-CODEC[@RANK]]`,
`scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]]`. AMOUNT is a sparse codec's density or a low-rank codec's
rank; WIRE the low-rank codec's factor wire, or how a sparse codec's entries travel (compact or plain)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from scalesgd.comm.codecs import CODECS, CodecOptions
from scalesgd.comm.codecs.registry import codec_option, flat_codec_options, options_from_flat
from scalesgd.comm.engine.exchange import exchange_names
from scalesgd.config import AUTO_CODECS, NO_PLANNER
from scalesgd.errors import UsageError

MODES_HELP = ("comma-separated: none (no exchange: the compute-only bound), ddp[-CODEC[@RANK]], "
              "scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]] (AMOUNT: a sparse codec's density, lowrank's "
              "rank; WIRE: lowrank's factor wire, e.g. scalesgd-lowrank@4/fp16, or a sparse codec's, compact or plain, "
              "e.g. scalesgd-topk@0.01/plain), auto[-EXCHANGE+EXCHANGE…[@DENSITY]] "
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
        return CODECS[self.codec].warm_start if self.engine in ("ddp", "scalesgd") else 0

    @property
    def auto_codecs(self) -> tuple[str, ...]:
        """An `auto` mode's candidate codecs."""
        return tuple(self.codec.split("+")) if self.engine == "auto" else ()

    @property
    def planner(self) -> str:
        return self.buckets.split(":", 1)[1] if self.buckets.startswith("planner:") else NO_PLANNER


def parse_mode(text: str) -> Mode:
    """`none`, `ddp[-CODEC[@RANK]]` or `scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]]`; ValueError
    otherwise.

    BUCKETS may be `planner:dlgs` or `planner:optimal` (profiled and planned at start-up).
    """
    engine, _, rest = text.partition("-")
    if engine == "none" and not rest:
        return Mode(text, "none")
    if text == "auto" or text.startswith(("auto-", "auto@")):
        body = text[len("auto-"):] if text.startswith("auto-") else AUTO_DEFAULT + text[len("auto"):]
        codecs, at, amount = body.partition("@")
        unknown = [c for c in codecs.split("+") if c not in exchange_names()]
        if unknown:
            raise ValueError(f"mode {text!r}: exchange {unknown[0]!r} is not known")
        return Mode(text, "auto", codecs, given=_given(text, {AUTO_AMOUNT: amount} if at else {}))
    if engine in ("ddp", "scalesgd"):
        # codec names may hold dashes (fp8-direct, topk-global): take the longest that fits
        fits = [c for c in CODECS if rest == c or rest.startswith((c + "-", c + "@", c + "/"))]
        codec = max(fits, key=len) if fits else (rest.split("-", 1)[0] or "fp32")
        tail, at, amount = rest[len(codec):], False, ""
        if tail.startswith("@"):  # the amount runs to the next dash that is not its own sign
            sign = "-" if tail.startswith("@-") else ""
            amount, _, tail = tail[1 + len(sign):].partition("-")
            at, amount = True, sign + amount
            amount, slash, wire = amount.partition("/")
            tail = (slash + wire + "-" + tail) if slash else tail
        slashed, wire = tail.startswith("/"), ""
        if slashed:
            wire, _, tail = tail[1:].partition("-")
        algorithm, _, buckets = tail.lstrip("-").partition("-")
        if engine == "ddp" and (algorithm or slashed):
            raise ValueError(f"mode {text!r}: a ddp mode is ddp-CODEC[@RANK]; DDP chooses its own algorithm and "
                             "buckets")
        if codec not in CODECS:
            raise ValueError(f"mode {text!r}: codec {codec!r} is not known; choose from {', '.join(CODECS)}")
        return Mode(text, engine, codec, algorithm or "ring", buckets or "size:1",
                    given=_amount_and_wire(text, engine, codec, amount if at else None, wire if slashed else None))
    raise ValueError(f"mode {text!r} is not known; use none, ddp[-CODEC[@RANK]] or "
                     "scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]]")


def _amount_and_wire(text: str, engine: str, codec: str, amount: str | None, wire: str | None) -> dict:
    """The options a mode's @AMOUNT and /WIRE set, as its codec's registration names them, checked as the options
    themselves are (ValueError naming the mode)."""
    entry = CODECS[codec]
    if amount is not None and entry.amount is None:
        takes = [name for name, e in CODECS.items() if e.amount is not None and e.runs_on(engine)]
        raise ValueError(f"mode {text!r}: {codec} takes no @AMOUNT; under {engine} {', '.join(takes)} take one")
    if wire is not None and (entry.wire_option is None or engine == "ddp"):
        takes = [name for name, e in CODECS.items() if e.wire_option is not None and e.runs_on("scalesgd")]
        raise ValueError(f"mode {text!r}: {codec} takes no /WIRE; {', '.join(takes)} take one")
    return _given(text, {**({entry.amount: amount} if amount is not None else {}),
                         **({entry.wire_option: wire} if wire is not None else {})})


def _given(text: str, values: dict[str, str]) -> tuple[tuple[str, Any], ...]:
    """Option values given as text, parsed and checked by their own declarations, by flat name."""
    parsed = {}
    for name, value in values.items():
        flat = codec_option(name)
        parse = flat.field.metadata["parse"] or type(flat.field.default)
        if not value:
            raise ValueError(f"mode {text!r}: give its {name} after the {'/' if name.endswith('wire') else '@'}")
        try:
            parsed[name] = parse(value)
        except ValueError:
            kind = "a whole number" if isinstance(flat.field.default, int) else "a number"
            raise ValueError(f"mode {text!r}: {name} {value!r} is not {kind}") from None
    try:
        options_from_flat(parsed)
    except UsageError as err:
        raise ValueError(f"mode {text!r}: {str(err).replace('`', '')}") from None
    return tuple(parsed.items())
