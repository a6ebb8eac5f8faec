"""Exchange modes by name, as `bench train` runs them and `simulate` predicts them: `none`, `ddp[-CODEC[@RANK]]`,
`scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]]`. AMOUNT is a sparse codec's density or a low-rank codec's
rank; WIRE the low-rank codec's factor wire, or how a sparse codec's entries travel (compact or plain)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from scalesgd.comm.codecs import CODECS
from scalesgd.comm.codecs.lowrank.codec import FACTOR_WIRES, LowrankOptions
from scalesgd.comm.wire.compact import SPARSE_WIRES
from scalesgd.comm.engine.exchange import exchange_names
from scalesgd.config import AUTO_CODECS, NO_PLANNER

MODES_HELP = ("comma-separated: none (no exchange: the compute-only bound), ddp[-CODEC[@RANK]], "
              "scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]] (AMOUNT: a sparse codec's density, lowrank's "
              "rank; WIRE: lowrank's factor wire, e.g. scalesgd-lowrank@4/fp16, or a sparse codec's, compact or plain, "
              "e.g. scalesgd-topk@0.01/plain), auto[-EXCHANGE+EXCHANGE…[@DENSITY]] "
              "(--exchange auto among those: our codecs by name, ddp and ddp-CODEC; default: --auto-codecs' own)")
AUTO_DEFAULT = "+".join(AUTO_CODECS)
LOW_RANK = ("lowrank", "lowrank-acp", "powersgd")  # codecs whose @ is a rank


@dataclass(frozen=True)
class Mode:
    """One way to exchange gradients: `none` (no exchange: the compute-only bound), DDP or scalesgd."""

    name: str
    engine: str
    codec: str = "fp32"
    algorithm: str = "ring"
    buckets: str = "size:1"
    density: float = 0.1
    rank: int = LowrankOptions().rank  # a low-rank codec's (and PyTorch's PowerSGD hook's) rank
    wire: str = ""  # a low-rank codec's factor wire, or a sparse codec's entries' ("": the codec's default)

    def codec_options(self) -> dict:
        """The training options this mode sets beyond its codec: the sparse density, the rank, the wire."""
        wire = "factor_wire" if self.codec in CODECS and CODECS[self.codec].family == "lowrank" else "topk_wire"
        return {"density": self.density, "rank": self.rank, **({wire: self.wire} if self.wire else {})}

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
    """`none`, `ddp[-CODEC]` or `scalesgd[-CODEC[@DENSITY][-ALGORITHM[-BUCKETS]]]`; ValueError otherwise.

    BUCKETS may be `planner:dlgs` or `planner:optimal` (profiled and planned at start-up).
    """
    engine, _, rest = text.partition("-")
    if engine == "none" and not rest:
        return Mode(text, "none")
    if text == "auto" or text.startswith(("auto-", "auto@")):
        body = text[len("auto-"):] if text.startswith("auto-") else AUTO_DEFAULT + text[len("auto"):]
        codecs, _, density = body.partition("@")
        unknown = [c for c in codecs.split("+") if c not in exchange_names()]
        if unknown:
            raise ValueError(f"mode {text!r}: exchange {unknown[0]!r} is not known")
        return Mode(text, "auto", codecs, density=_density(text, density))
    if engine in ("ddp", "scalesgd"):
        # codec names may hold dashes (fp8-direct, topk-global): take the longest that fits
        fits = [c for c in CODECS if rest == c or rest.startswith((c + "-", c + "@", c + "/"))]
        codec = max(fits, key=len) if fits else (rest.split("-", 1)[0] or "fp32")
        tail, amount = rest[len(codec):], ""
        if tail.startswith("@"):  # the amount runs to the next dash that is not its own sign
            sign = "-" if tail.startswith("@-") else ""
            amount, _, tail = tail[1 + len(sign):].partition("-")
            amount = sign + amount
            amount, slash, wire = amount.partition("/")
            tail = (slash + wire + "-" + tail) if slash else tail
        wire = ""
        if tail.startswith("/"):
            wire, _, tail = tail[1:].partition("-")
        algorithm, _, buckets = tail.lstrip("-").partition("-")
        if engine == "ddp" and (algorithm or wire):
            raise ValueError(f"mode {text!r}: a ddp mode is ddp-CODEC[@RANK]; DDP chooses its own algorithm and "
                             "buckets")
        return _with_amount(Mode(text, engine, codec, algorithm or "ring", buckets or "size:1"), amount, wire)
    raise ValueError(f"mode {text!r} is not known; use none, ddp[-CODEC[@RANK]] or "
                     "scalesgd[-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]]")


def _with_amount(mode: Mode, amount: str, wire: str) -> Mode:
    """`mode` with its codec's amount (a density, or for lowrank and PyTorch's PowerSGD a rank) and wire."""
    low_rank = mode.codec in LOW_RANK
    sparse = mode.codec in CODECS and CODECS[mode.codec].sparse
    factored = mode.codec in CODECS and CODECS[mode.codec].family == "lowrank"
    if wire and not (factored or sparse):
        raise ValueError(f"mode {mode.name!r}: /{wire} sets lowrank's factor wire or a sparse codec's; "
                         f"{mode.codec} has none")
    wires = SPARSE_WIRES if sparse else FACTOR_WIRES
    if wire and wire not in wires:
        raise ValueError(f"mode {mode.name!r}: wire {wire!r} is not known; choose from {', '.join(wires)}")
    if not low_rank:
        if mode.engine == "ddp" and amount:
            raise ValueError(f"mode {mode.name!r}: @ gives PyTorch's PowerSGD hook its rank; {mode.codec} takes none")
        return replace(mode, density=_density(mode.name, amount), wire=wire)
    if amount and not (amount.isdigit() and int(amount) >= 1):
        raise ValueError(f"mode {mode.name!r}: rank {amount!r} must be a whole number >= 1")
    return replace(mode, rank=int(amount) if amount else mode.rank, wire=wire)


def _density(mode: str, text: str) -> float:
    """A mode's density: the number after @, in (0, 1] (0.1 where none is given); ValueError naming it otherwise."""
    if not text:
        return 0.1
    try:
        density = float(text)
    except ValueError:
        raise ValueError(f"mode {mode!r}: density {text!r} is not a number") from None
    if not 0 < density <= 1:
        raise ValueError(f"mode {mode!r}: density {text} must be in (0, 1], the fraction of entries sent")
    return density
