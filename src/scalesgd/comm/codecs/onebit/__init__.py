"""1-bit Adam's exchange after Tang et al. 2021 ("1-bit Adam: Communication Efficient Large-Scale Training with
Adam's Convergence Speed"): the momentum as packed signs and per-chunk scales, with worker and server error
feedback; its options family and its registration. The optimizer that takes its result is
`scalesgd.optim.onebit_adam.OneBitAdam`."""

from scalesgd.comm.codecs.onebit.codec import OnebitCodec, OnebitOptions
from scalesgd.comm.codecs.registry import CODEC_OPTIONS, CODECS, CodecEntry, CodecSettings

CODEC_OPTIONS.add("onebit", OnebitOptions)


def _onebit(s: CodecSettings) -> OnebitCodec:
    """The codec with the family's options."""
    o = s.options["onebit"]
    return OnebitCodec(beta1=o.beta1, chunk=o.chunk)


# No cost model: its all-to-all half sends pairwise, which shares a node's link with the node's other processes,
# so the simulator's ring model of a dense codec would flatter it across nodes.
CODECS.add("onebit", CodecEntry("1-bit Adam: the momentum as signs with error feedback, ~32x fewer bytes than fp32, "
                                "after the dense warm-up (--compress-after); needs the onebit-adam optimizer "
                                "(Tang et al. 2021)", _onebit, family="onebit", optimizer="onebit-adam",
                                beta1_option="onebit_beta1", dense_start=True,
                                keeps_gradients=True, joinable=False))

__all__ = ["OnebitCodec", "OnebitOptions"]
