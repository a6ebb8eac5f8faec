"""Each step's squared norm of this rank's gradient before the exchange and of the exchanged mean, summed over the
buckets: what the gradient noise scale is estimated from (`scalesgd.recipe.noise_scale`). They stay on the
gradients' device; the training loop reads them with its own periodic allreduce, so no step waits for the host.

The engine measures through `MeasuredCodec` (around any codec); DDP through `measured_hook` (around any hook:
ours, PyTorch's, or its plain allreduce)."""

# No `from __future__ import annotations`: DDP checks that a hook's `bucket` annotation is the real class.
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalesgd.comm.codecs.base import BucketView, Channel, Codec


class GradientNorms:
    """Running sums of one step's squared norms: (local before the exchange, exchanged mean)."""

    def __init__(self):
        self._lock = threading.Lock()  # buckets finish on several threads (gloo's, the exchange's)
        self._sums: torch.Tensor | None = None

    def add(self, which: int, tensor: torch.Tensor) -> None:
        square = tensor.detach().double().square().sum()
        with self._lock:
            if self._sums is None:
                self._sums = torch.zeros(2, dtype=torch.float64, device=tensor.device)
            self._sums[which] += square

    def pop(self) -> torch.Tensor:
        """This step's (local, mean) squared norms, on the device; zeros before any bucket. Starts the next step."""
        with self._lock:
            sums, self._sums = self._sums, None
        return sums if sums is not None else torch.zeros(2, dtype=torch.float64)


LOCAL, MEAN = 0, 1


class MeasuredCodec(Codec):
    """`inner` exchanging as ever, with the squared norms of what it is given and of the mean it writes counted.
    Everything else (state, counters, its own attributes) is the inner codec's."""

    def __init__(self, inner: Codec, norms: GradientNorms):
        self.__dict__.update(inner=inner, norms=norms, name=inner.name, needs_topology=inner.needs_topology,
                             encode_in_backward=inner.encode_in_backward)

    def __getattr__(self, name):  # anything not defined here is the inner codec's
        if "inner" not in self.__dict__:  # being copied or unpickled: not built yet
            raise AttributeError(name)
        return getattr(self.__dict__["inner"], name)

    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        self.norms.add(LOCAL, flat)
        return self.inner.encode(flat, bucket, channel)

    def communicate(self, wire: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        return self.inner.communicate(wire, bucket, channel)

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        self.inner.decode(wire, bucket, out, channel)
        self.norms.add(MEAN, out)

    def bind(self, params: list[torch.Tensor]) -> None:
        self.inner.bind(params)

    def key(self, param: torch.Tensor) -> int:
        return self.inner.key(param)

    def after_dense(self, out: torch.Tensor, bucket: BucketView) -> None:
        self.inner.after_dense(out, bucket)

    def counters(self) -> dict[str, float]:
        return self.inner.counters()

    def pop_notices(self) -> list:
        return self.inner.pop_notices()

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


@dataclass
class MeasuredHook:
    """A DDP hook and its state, with the norms its buckets add to."""

    norms: GradientNorms
    state: object
    hook: object

    def close(self) -> None:
        if hasattr(self.state, "close"):
            self.state.close()


def measured_hook(measured: MeasuredHook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Count the bucket's local squared norm, run the inner hook, count the mean it gives back."""
    measured.norms.add(LOCAL, bucket.buffer())

    def count(future: torch.futures.Future) -> torch.Tensor:
        mean = future.value()
        mean = mean[0] if isinstance(mean, list) else mean
        measured.norms.add(MEAN, mean)
        return mean

    return measured.hook(measured.state, bucket).then(count)
