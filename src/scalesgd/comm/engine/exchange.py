"""The engines by name, PyTorch's as they come under their own names and ours under ours: DDP (`ddp`: its allreduce,
its hooks or ours) and our `DistributedOptimizer` (`scalesgd`); FSDP2 as it comes (`fsdp2`: its own reduce-scatter)
and our sharded engine (`scalesgd-fsdp`: FSDP2's shards with the codec on their reduce-scatter,
`comm/engine/fsdp.py`). Each is a `GradientExchange` (`comm/engine/base.py`), the one object a loop talks to:

    exchange = build_exchange("scalesgd", model, optimizer, ExchangeSetup(codec="fp8", precision="bf16"))
    with exchange.no_sync():                       # micro-batches before the last: gradients only summed
        with exchange.autocast(): loss = … exchange.model(x) …
        exchange.backward(loss)
    with exchange.autocast(): loss = … exchange.model(x) …
    exchange.backward(loss)                        # buckets travel while backward goes on
    exchange.step()                                # with the mean gradient (False: fp16 overflowed, skipped)
    exchange.stats(), exchange.state_dict(), exchange.close()
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import CODECS, CodecEntry, DdpHook, make_codec
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.codecs.pytorch import allreduce
from scalesgd.comm.codecs.registry import SHARDED_ENGINE
from scalesgd.comm.engine.base import ExchangeSetup, GradientExchange
from scalesgd.comm.engine.ddp_hook import CodecHookState, codec_hook
from scalesgd.comm.engine.fsdp import Fsdp2Exchange, FsdpExchange
from scalesgd.comm.engine.optimizer import DistributedOptimizer, IterationStats
from scalesgd.comm.engine.policies import MeasuredHook, measured_hook
from scalesgd.errors import Renamed
from scalesgd.registry import Registry

__all__ = ["ENGINES", "RENAMED", "SHARDED", "ExchangeSetup", "GradientExchange", "build_exchange", "engine_named",
           "exchange_names", "parse_exchange"]


class DdpExchange(GradientExchange):
    """PyTorch DDP with its own allreduce, with PyTorch's hook that stands for the codec, or with ours as a hook."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, setup: ExchangeSetup):
        entry = CODECS[setup.codec]
        on_cuda = next(model.parameters()).is_cuda
        self._hook_state = None
        if entry.torch_hook is not None:
            hook = entry.torch_hook(on_cuda, setup.settings)
        else:
            self._hook_state = CodecHookState(setup.codec, setup.group, setup.topology, setup.settings, model,
                                              setup.compress_after)
            hook = DdpHook(self._hook_state, codec_hook)
        if setup.norms is not None:  # around the hook, or around DDP's own allreduce as a hook
            inner = hook or DdpHook(None, allreduce)
            hook = DdpHook(MeasuredHook(setup.norms, inner.state, inner.hook), measured_hook, inner.bucket_cap_mb)
        ddp = DistributedDataParallel(model, device_ids=[next(model.parameters()).device.index] if on_cuda else None,
                                      bucket_cap_mb=hook.bucket_cap_mb if hook is not None else None,
                                      process_group=setup.process_group)
        if hook is not None:
            ddp.register_comm_hook(hook.state, hook.hook)
        self._hook = hook
        super().__init__(ddp, optimizer, self._hook_state.driver if self._hook_state is not None else None,
                         bare=model, norms=setup.norms, precision=setup.precision, clip_norm=setup.clip_norm)

    @staticmethod
    def uses_own_group(codec: CodecEntry) -> bool:
        return codec.torch_hook is None  # our hook exchanges in its own group; PyTorch's use DDP's

    def no_sync(self) -> AbstractContextManager:
        return self.model.no_sync()

    def close(self) -> None:
        if self._hook is not None:
            self._hook.close()


class LocalExchange(GradientExchange):
    """No exchange: the worker steps alone (a one-process replica, which periodic synchronisation joins to the
    others every H steps)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, setup: ExchangeSetup):
        super().__init__(model, optimizer, None, precision=setup.precision, clip_norm=setup.clip_norm)

    def no_sync(self) -> AbstractContextManager:
        return nullcontext()


class EngineExchange(GradientExchange):
    """scalesgd's own engine (`DistributedOptimizer`): any codec, allreduce algorithm and bucket plan."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, setup: ExchangeSetup):
        entry = CODECS[setup.codec]
        engine = DistributedOptimizer(optimizer, model, make_codec(setup.codec, setup.settings),
                                      algorithm=setup.algorithm, buckets=entry.buckets or setup.buckets,
                                      group=setup.group, topology=setup.topology, tracer=setup.tracer,
                                      compress_after=setup.compress_after, norms=setup.norms)
        super().__init__(model, engine, engine.driver, engine.plan, norms=setup.norms, precision=setup.precision,
                         clip_norm=setup.clip_norm)

    def no_sync(self) -> AbstractContextManager:
        return self.optimizer.no_sync()

    def synchronize(self) -> None:
        self.optimizer.synchronize()

    def stats(self) -> IterationStats:
        return self.optimizer.pop_stats()

    def close(self) -> None:
        self.optimizer.close()


ENGINES: Registry[type[GradientExchange]] = Registry("engine")
ENGINES.add("ddp", DdpExchange)
ENGINES.add("scalesgd", EngineExchange)
ENGINES.add(SHARDED_ENGINE, FsdpExchange)
ENGINES.add("fsdp2", Fsdp2Exchange)
RENAMED = {"fsdp": SHARDED_ENGINE}  # an engine's earlier name → its name now
# the engines that shard the model before the optimizer is built (each lays it out with its `shard`)
SHARDED = tuple(name for name, engine in ENGINES.items() if issubclass(engine, FsdpExchange))


def engine_named(name: str, warn: bool = True) -> str:
    """The engine `name` stands for: itself, or the engine an earlier name now is (`warn`: saying so, as a `Renamed`
    warning)."""
    if name in RENAMED:
        if warn:
            warnings.warn(f"`engine` {name} is now {RENAMED[name]} (ours, beside fsdp2, FSDP2 as it comes, as scalesgd "
                          f"is beside ddp); {name} still works", Renamed, stacklevel=2)
        return RENAMED[name]
    return name


def parse_exchange(name: str) -> tuple[str, str]:
    """(engine, codec) an exchange's name stands for, as `bench train` names modes: CODEC is ours on our engine; ddp
    is DDP's own allreduce, ddp-CODEC DDP with that codec's hook (PyTorch's own for fp16, bf16 and powersgd)."""
    if name == "ddp":
        return "ddp", DENSE.name
    if name.startswith("ddp-"):
        return "ddp", name[len("ddp-"):]
    return "scalesgd", name


def exchange_names() -> list[str]:
    """Every exchange by name, as `parse_exchange` reads them: our engine's codecs, then DDP's."""
    ours = [name for name, entry in CODECS.items() if entry.runs_on("scalesgd")]
    return ours + ["ddp"] + [f"ddp-{name}" for name, entry in CODECS.items()
                             if entry.runs_on("ddp") and name != DENSE.name]


def build_exchange(engine: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                   setup: ExchangeSetup) -> GradientExchange:
    """Wrap `model` and `optimizer` in the registered engine (collective: every rank, together)."""
    engine = engine_named(engine)
    site = ENGINES[engine].codec_site(model) if engine in ENGINES else None
    if not CODECS[setup.codec].runs_on(site or engine):
        where = "the cross-node sum of a model sharded within each node" if site else f"engine {engine!r}"
        raise ValueError(f"codec {setup.codec!r} does not run on {where}")
    return ENGINES[engine](model, optimizer, setup)
