"""scalesgd: data-parallel training that is accurate at large minibatches and fast on slow networks."""

from scalesgd.comm.engine.agreement import RanksDisagree
from scalesgd.comm.engine.ddp_hook import CodecHookState, codec_hook
from scalesgd.comm.engine.optimizer import DistributedOptimizer

__version__ = "0.1.0"

__all__ = ["CodecHookState", "DistributedOptimizer", "RanksDisagree", "__version__", "codec_hook"]
