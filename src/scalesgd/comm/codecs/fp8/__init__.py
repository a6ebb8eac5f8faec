"""fp8 (e5m2) exchange after Oyama et al. 2020: the kernels, the saturating sums, each tensor's range and the
family's options, the codec; and their registration."""

from scalesgd.comm.codecs.fp8.codec import Fp8Codec
from scalesgd.comm.codecs.fp8.ranges import Fp8Options
from scalesgd.comm.codecs.registry import CODEC_OPTIONS, CODECS, CodecEntry, DenseCost

CODEC_OPTIONS.add("fp8", Fp8Options)
FLAG_BYTES = 4  # the flags' small allreduce beside a sum ending in the shards (int32: gloo has no byte max)


def _fp8(name: str, relative: bool, two_stage: bool):
    """Its kernels compiled for exchanges every step only: a periodic run's H× fewer calls save less than the compile
    costs (the default GPT at H 16 on 4 testbed nodes reached its target in 48–56 s eager, 63–68 s compiled:
    docs/results.md#fp8-compile)."""
    return lambda s: Fp8Codec(name, relative=relative, two_stage=two_stage, options=s.options["fp8"], seed=s.seed,
                              every_step=s.local_steps == 1)


CODECS.add("fp8", CodecEntry("e5m2 relative to the weights, summed in two stages (Oyama et al. 2020)",
                             _fp8("fp8", relative=True, two_stage=True), family="fp8", needs_topology=True,
                             cost=lambda o: DenseCost(1), scatters=True, reads_weights=True, flag_bytes=FLAG_BYTES))
CODECS.add("fp8-direct", CodecEntry("ablation: the gradient itself in e5m2", _fp8("fp8-direct", False, True),
                                    family="fp8", needs_topology=True, cost=lambda o: DenseCost(1), scatters=True,
                                    flag_bytes=FLAG_BYTES))
CODECS.add("fp8-flat", CodecEntry("ablation: one fp8 ring over all ranks", _fp8("fp8-flat", True, False),
                                  family="fp8", cost=lambda o: DenseCost(1), scatters=True, reads_weights=True,
                                  flag_bytes=FLAG_BYTES))
