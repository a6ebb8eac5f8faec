"""scalesgd: data-parallel training that is accurate at large minibatches and fast on slow networks.

Its faces: `DistributedOptimizer` (our engine around a torch optimizer), `codec_hook` with `CodecHookState` (our codecs
inside DDP), `shard_model` with `build_exchange("scalesgd-fsdp", …)` (our codecs on FSDP2's shards), and `DiLoCo`
(periodic synchronisation around a loop of one's own)."""

from scalesgd.comm.engine.agreement import RanksDisagree
from scalesgd.comm.engine.ddp_hook import CodecHookState, codec_hook
from scalesgd.comm.engine.exchange import ExchangeSetup, build_exchange
from scalesgd.comm.engine.fsdp import shard_model
from scalesgd.comm.engine.optimizer import DistributedOptimizer
from scalesgd.periodic import DiLoCo

__version__ = "0.1.0"

__all__ = ["CodecHookState", "DiLoCo", "DistributedOptimizer", "ExchangeSetup", "RanksDisagree", "__version__",
           "build_exchange", "codec_hook", "shard_model"]
