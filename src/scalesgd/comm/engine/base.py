"""What every engine is to a training loop: the setup it is built from and the one object the loop talks to."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from scalesgd.comm.codecs import Codec, CodecEntry, CodecSettings
from scalesgd.comm.engine.buckets import BucketPlan
from scalesgd.comm.engine.driver import BucketDriver
from scalesgd.comm.engine.optimizer import IterationStats
from scalesgd.comm.engine.policies import GradientNorms
from scalesgd.trace import Tracer


@dataclass
class ExchangeSetup:
    """How gradients travel: the codec and its settings, the allreduce, the bucket plan, the groups, the tracer."""

    codec: str = "fp32"
    settings: CodecSettings = field(default_factory=CodecSettings)
    compress_after: int = 0  # each parameter's first steps exchanged dense (fp32) before the codec takes over
    algorithm: str = "ring"
    buckets: str | BucketPlan = "size:1"  # a plan spec, or a plan (the planner's)
    group: object = None  # the exchange's own process group (None: a new one where the engine needs it)
    topology: object = None  # prebuilt node and cross-node groups (None: built when needed)
    tracer: Tracer = field(default_factory=Tracer)
    norms: GradientNorms | None = None  # given: each step's local and mean squared norms are counted into it
    precision: str = "fp32"  # forward and backward under autocast to bf16 or fp16 (with a gradient scaler)
    clip_norm: float = 0.0  # the mean gradient's global norm clipped to this before each step (0: never)
    process_group: object = None  # the ranks whose gradients the engine averages, DDP's `process_group` (None: all)


AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # precision → autocast dtype


class GradientExchange(ABC):
    """The model to call, the optimizer to step, the codec's driver (its state differs per rank; None where PyTorch's
    own hook or allreduce exchanges), the precision forward and backward run in, and the run's view of it.

    Under fp16 a `GradScaler` scales the loss; the codec's driver divides its scale out of what a stateful codec
    keeps (residuals, momentum) and the step is skipped on every rank when any rank overflowed (every codec makes
    a non-finite bucket non-finite on every rank, and keeps its state as it was)."""

    def __init__(self, model: nn.Module, optimizer, driver: BucketDriver | None, plan: BucketPlan | None = None,
                 bare: nn.Module | None = None, norms: GradientNorms | None = None, precision: str = "fp32",
                 clip_norm: float = 0.0, scaler: torch.amp.GradScaler | None = None):
        """`scaler`: the loss scaler of an engine this one runs over, whose step it shares (its own driver then sends
        no loss-scaled gradients); None: one of its own for `precision`, which the driver follows."""
        self.model = model
        self.bare = bare or model  # the model itself (`model` may wrap it: DDP)
        self.norms = norms
        self.optimizer = optimizer
        self.driver = driver
        self.codec: Codec | None = driver.codec if driver is not None else None
        self.plan = plan  # the buckets, where the engine has its own plan
        self._names = {id(p): name for name, p in (bare or model).named_parameters()}
        self.device = next((bare or model).parameters()).device
        self.precision = precision
        self.clip_norm = clip_norm
        if scaler is None:
            scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
            if driver is not None:
                driver.follow(scaler)
        self.scaler = scaler

    def autocast(self) -> AbstractContextManager:
        """Forward (and the loss) in the run's precision: autocast to bf16 or fp16, nothing for fp32."""
        dtype = AUTOCAST[self.precision]
        return torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate `loss`, scaled under fp16; the exchange starts as buckets fill (unless in `no_sync`)."""
        self.scaler.scale(loss).backward()

    @abstractmethod
    def no_sync(self) -> AbstractContextManager:
        """Backward passes inside only sum into the gradients; the next one outside exchanges the sum."""

    def synchronize(self) -> None:
        """Wait until the mean gradients are in `.grad` (DDP's backward already waits for them)."""

    def step(self) -> bool:
        """Step the optimizer with the mean gradients (their global norm clipped to `clip_norm` where given); False
        where fp16's scaler found an overflow and skipped it."""
        if not self.scaler.is_enabled():
            self._clip()
            self.optimizer.step()
            return True
        self.synchronize()
        if self.clip_norm:
            self.scaler.unscale_(self.optimizer)  # the norm of the gradient itself, not of the scaled one
        self._clip()
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= before

    def _clip(self) -> None:
        """The mean gradients scaled down to `clip_norm` where their norm (over every parameter; a sharded one's
        from its shards) exceeds it."""
        if self.clip_norm:
            self.synchronize()
            torch.nn.utils.clip_grad_norm_(list(self.model.parameters()), self.clip_norm)

    @staticmethod
    def uses_own_group(codec: CodecEntry) -> bool:
        """Whether `codec` is exchanged in a process group of its own (which the run creates at start-up)."""
        return True

    def pop_norms(self) -> torch.Tensor:
        """This step's (local, mean) squared gradient norms on the device, where `ExchangeSetup.norms` was given."""
        return self.norms.pop() if self.norms is not None else torch.zeros(2, dtype=torch.float64)

    def evaluated(self) -> AbstractContextManager:
        """The model as the run reports it, while evaluated (the global parameters, where workers step alone)."""
        return nullcontext()

    def settle(self) -> None:
        """At the run's end: whatever is still on its way lands (collective), so every rank holds the same model."""

    def stats(self) -> IterationStats | None:
        """This rank's exchange times and bytes since the last call; None where the engine does not measure them."""
        return None

    def counters(self) -> dict[str, float]:
        """This rank's codec guardrail counters since the last call (saturation, density, overflow …)."""
        return self.codec.counters() if self.codec is not None else {}

    def notices(self) -> list[str]:
        """What the codec changed on its own since the last call, each naming its parameter."""
        if self.codec is None:
            return []
        return [f"{self._names.get(id(param), 'a parameter')}: {text}" for param, text in self.codec.pop_notices()]

    def state_dict(self) -> dict:
        """This rank's state: the optimizer's, the codec's (residuals and ranges differ between ranks) and fp16's
        loss scale (the same on every rank)."""
        return {"optimizer": self.optimizer.state_dict(),
                "codec": self.driver.state_dict() if self.driver is not None else None,
                "scaler": self.scaler.state_dict()}

    def layout(self) -> list[int] | None:
        """Which part of the model this rank holds, where it holds a part (state kept for one part is another
        rank's only where the layouts agree); None: the whole model."""
        return None

    @classmethod
    def codec_site(cls, model: nn.Module) -> str | None:
        """Where the codec runs on `model` when not in the engine's own exchange (`registry.CROSS_NODE_SHARDS`: the
        sharded engine's cross-node sum); None: in the engine's."""
        return None

    def model_state(self, model: nn.Module) -> dict:
        """`model`'s parameters and buffers whole, as a checkpoint keeps them (collective where they are sharded)."""
        return model.state_dict()

    def sharded_state(self, model: nn.Module) -> dict | None:
        """This rank's shards of the model and the optimizer's state, for `torch.distributed.checkpoint` (collective);
        None where every rank holds them whole (the checkpoint file keeps them)."""
        return None

    def load_sharded_state(self, model: nn.Module, folder) -> None:
        """This rank's shards from a checkpoint's folder, whatever the world size that wrote it (collective)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no shards")

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.driver is not None and state.get("codec") is not None:
            self.driver.load_state_dict(state["codec"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])

    def close(self) -> None:
        """Stop whatever thread the exchange runs on."""
