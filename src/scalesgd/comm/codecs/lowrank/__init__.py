"""Low-rank exchange after Vogels et al. 2019 (PowerSGD), as our codec: each gradient matrix as two rank-r factors
with error feedback and a warm start, the factors on a dense wire of ours, or one factor a step (ACP-SGD); the
family's options and the registration."""

from scalesgd.comm.codecs.lowrank.codec import FACTOR_WIRES, LowrankCodec, LowrankOptions
from scalesgd.comm.codecs.registry import CODEC_OPTIONS, CODECS, CodecEntry, CodecOptions, LowRankCost

CODEC_OPTIONS.add("lowrank", LowrankOptions)


def _cost(sums: int):
    """What the simulator costs: the factors (one sum a step, or P and Q one after another) on the factor wire."""
    def cost(options: CodecOptions) -> LowRankCost:
        o = options["lowrank"]
        wire = FACTOR_WIRES[o.factor_wire]
        return LowRankCost(sums, o.rank, o.min_rate, wire.itemsize if wire is not None else 4)
    return cost


CODECS.add("lowrank", CodecEntry("PowerSGD's rank-r factors with error feedback, on our engine and as our hook, "
                                 "their wire chosen by --factor-wire: fp32, fp16, bf16 or fp8 (Vogels et al. 2019)",
                                 lambda s: LowrankCodec(s.options["lowrank"], seed=s.seed,
                                                        fp8=s.options["fp8"]), family="lowrank",
                                 keeps_gradients=True, cost=_cost(2), amount="rank", wire_option="factor_wire"))
CODECS.add("lowrank-acp", CodecEntry("lowrank sending one factor a step, P and Q in turn: one sum a step instead of "
                                     "two (ACP-SGD, Zhang et al. 2023)",
                                     lambda s: LowrankCodec(s.options["lowrank"], seed=s.seed, alternate=True,
                                                            fp8=s.options["fp8"]),
                                     family="lowrank", keeps_gradients=True, cost=_cost(1), amount="rank", wire_option="factor_wire"))

__all__ = ["LowrankCodec", "LowrankOptions"]
