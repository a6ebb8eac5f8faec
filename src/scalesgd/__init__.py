"""scalesgd: data-parallel training that is accurate at large minibatches and fast on slow networks.

Its faces: `DistributedOptimizer` (our engine around a torch optimizer), `codec_hook` with `CodecHookState` (our codecs
inside DDP), `shard_model` with `build_exchange("scalesgd-fsdp", …)` (our codecs on FSDP2's shards), and `DiLoCo`
(periodic synchronisation around a loop of one's own). Each is imported when first asked for: a process that needs
one module of the package (an elastic run's coordinator) does not pay for the engines' imports (FSDP2's, 0.7 s)."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_FACES = {"RanksDisagree": "scalesgd.comm.engine.agreement", "CodecHookState": "scalesgd.comm.engine.ddp_hook",
          "codec_hook": "scalesgd.comm.engine.ddp_hook", "ExchangeSetup": "scalesgd.comm.engine.exchange",
          "build_exchange": "scalesgd.comm.engine.exchange", "shard_model": "scalesgd.comm.engine.fsdp",
          "DistributedOptimizer": "scalesgd.comm.engine.optimizer", "DiLoCo": "scalesgd.periodic"}

__all__ = ["CodecHookState", "DiLoCo", "DistributedOptimizer", "ExchangeSetup", "RanksDisagree", "__version__",
           "build_exchange", "codec_hook", "shard_model"]


def __getattr__(name: str):
    if name not in _FACES:
        raise AttributeError(f"module 'scalesgd' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_FACES[name]), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
