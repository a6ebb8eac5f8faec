"""The gradient exchange, by concern: `wire` (collectives built from point-to-point primitives, pipelined steps,
the node topology), `codecs` (what travels: fp32/fp16/bf16, fp8, top-k, PyTorch's own hooks), `engine` (our
DistributedOptimizer, the DDP hook and the exchange object a loop talks to) and `cost` (the timing model, the
planner and the measurements they are fitted to)."""

from scalesgd.comm.wire.collectives import ALGORITHMS, allreduce

__all__ = ["ALGORITHMS", "allreduce"]
