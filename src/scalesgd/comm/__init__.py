"""The gradient exchange: collectives, topology, bucket plans, codecs and the engine."""

from scalesgd.comm.collectives import ALGORITHMS, allreduce

__all__ = ["ALGORITHMS", "allreduce"]
