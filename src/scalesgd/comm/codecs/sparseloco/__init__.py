"""SparseLoCo's sparse two-bit pseudo-gradients (Sarfi et al. 2025): the family's options, the codec; and their
registration."""

from scalesgd.comm.codecs.registry import CODEC_OPTIONS, CODECS, CodecEntry, CodecOptions, CodecSettings, SparseCost
from scalesgd.comm.codecs.sparseloco.codec import SparseLocoCodec, SparseLocoOptions
from scalesgd.comm.wire.chunked import ChunkWire

CODEC_OPTIONS.add("sparseloco", SparseLocoOptions)


def _cost(options: CodecOptions) -> SparseCost:
    """What the simulator costs: `top` of every `chunk` entries at the chunked wire's bytes an entry."""
    o = options["sparseloco"]
    return SparseCost(o.top / o.chunk, ChunkWire.name, ChunkWire(o.chunk, o.top).entry_bytes())


def _build(settings: CodecSettings) -> SparseLocoCodec:
    return SparseLocoCodec("sparseloco", settings.options["sparseloco"])


CODECS.add("sparseloco", CodecEntry(
    "SparseLoCo: a chunked top-k (64 of 4096) at 2 bits, decayed error feedback in place of the outer momentum "
    "(Sarfi et al. 2025)", _build, family="sparseloco", sparse=True, keeps_gradients=True, cost=_cost,
    amount="sparseloco_top", recipe={"outer_lr": 1.0, "outer_momentum": 0.0}))

__all__ = ["SparseLocoCodec", "SparseLocoOptions"]
