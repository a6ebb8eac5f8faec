"""Top-k sparsification with residuals after Ju et al. 2024 (DLGS), with Deep Gradient Compression's corrections:
the family's options, the codec over all ranks and across nodes only; and their registration."""

from scalesgd.comm.codecs.registry import CODEC_OPTIONS, CODECS, CodecEntry, CodecOptions, CodecSettings, SparseCost
from scalesgd.comm.codecs.topk.codec import TopkCodec, TopkOptions
from scalesgd.comm.codecs.topk.nodes import NodeTopkCodec

CODEC_OPTIONS.add("topk", TopkOptions)


def _topk(name: str, reuse_every: int | None = None, kind: type = TopkCodec):
    """A sparse codec's builder: the family's options, the threshold reused as they say (or every `reuse_every`)."""
    def build(s: CodecSettings) -> TopkCodec:
        o = s.options["topk"]
        return kind(name, o.density, reuse_every or o.reuse,
                    o.dgc(s.momentum, s.nesterov, s.steps_per_epoch, s.momentum_average), o.wire)
    return build


def _cost(options: CodecOptions) -> SparseCost:
    """What the simulator costs: the density's pairs on the entries' wire."""
    return SparseCost(options["topk"].density, options["topk"].wire)


SPARSE = dict(family="topk", sparse=True, keeps_gradients=True, cost=_cost, amount="density", wire_option="topk_wire",
              planned_as_topk=True)  # every one's facts

CODECS.add("topk", CodecEntry("DLGS: per-group top-k with residuals, thresholds reused (Ju et al. 2024)",
                              _topk("topk"), **SPARSE))
CODECS.add("topk-global", CodecEntry("one exact top-k over all gradients each step", _topk("topk-global", 1),
                                     buckets="single", **SPARSE))
CODECS.add("topk-nodes", CodecEntry("top-k across nodes only: summed densely inside each node, each local rank's "
                                    "shard sparsified between nodes", _topk("topk-nodes", kind=NodeTopkCodec),
                                    needs_topology=True, **SPARSE))
CODECS.add("lags", CodecEntry("an exact top-k per layer each step", _topk("lags", 1), buckets="layer",
                              **SPARSE))
