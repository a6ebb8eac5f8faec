"""Exchange modes by name, as `bench train` runs them and `simulate` predicts them: `none`, `ddp[-CODEC]`,
`scalesgd[-CODEC[@DENSITY][-ALGORITHM[-BUCKETS]]]`."""

from __future__ import annotations

from dataclasses import dataclass

from scalesgd.comm.codecs import CODECS
from scalesgd.config import NO_PLANNER

MODES_HELP = ("comma-separated: none (no exchange: the compute-only bound), ddp[-CODEC], "
              "scalesgd[-CODEC[@DENSITY][-ALGORITHM[-BUCKETS]]], auto[-CODEC+CODEC…[@DENSITY]] (--exchange auto "
              "among those codecs, default fp32+fp16+bf16+fp8)")
AUTO_DEFAULT = "fp32+fp16+bf16+fp8"


@dataclass(frozen=True)
class Mode:
    """One way to exchange gradients: `none` (no exchange: the compute-only bound), DDP or scalesgd."""

    name: str
    engine: str
    codec: str = "fp32"
    algorithm: str = "ring"
    buckets: str = "size:1"
    density: float = 0.1

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
        unknown = [c for c in codecs.split("+") if c not in CODECS]
        if unknown:
            raise ValueError(f"mode {text!r}: codec {unknown[0]!r} is not known")
        return Mode(text, "auto", codecs, density=_density(text, density))
    if engine == "ddp":
        return Mode(text, "ddp", rest or "fp32")
    if engine == "scalesgd":
        # codec names may hold dashes (fp8-direct, topk-global): take the longest that fits
        fits = [c for c in CODECS if rest == c or rest.startswith((c + "-", c + "@"))]
        codec = max(fits, key=len) if fits else (rest.split("-", 1)[0] or "fp32")
        tail, density = rest[len(codec):], ""
        if tail.startswith("@"):  # the density runs to the next dash that is not its own sign
            sign = "-" if tail.startswith("@-") else ""
            density, _, tail = tail[1 + len(sign):].partition("-")
            density = sign + density
        algorithm, _, buckets = tail.lstrip("-").partition("-")
        return Mode(text, "scalesgd", codec, algorithm or "ring", buckets or "size:1", _density(text, density))
    raise ValueError(f"mode {text!r} is not known; use none, ddp[-CODEC] or "
                     "scalesgd[-CODEC[@DENSITY][-ALGORITHM[-BUCKETS]]]")


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
