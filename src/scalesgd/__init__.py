"""scalesgd: data-parallel training that is accurate at large minibatches and fast on slow networks."""

from scalesgd.comm.engine.ddp_hook import CodecHookState, codec_hook
from scalesgd.comm.engine.optimizer import DistributedOptimizer

__version__ = "0.1.0"

__all__ = ["CodecHookState", "DistributedOptimizer", "codec_hook", "__version__"]
