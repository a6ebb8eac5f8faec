"""What the engines apply around any codec: dense steps first, and counting the gradient norms.

Dense first: a run's first steps are exchanged dense (fp32), as PowerSGD's start iteration is, so a lossy codec
never meets the large, fast-changing gradients of the first iterations. Steps are counted per parameter, so
DDP's bucket rebuild and a resume keep the count.

Gradient norms: each step's squared norm of this rank's gradient before the exchange and of the exchanged mean,
summed over the buckets: what the gradient noise scale is estimated from (`scalesgd.recipe.noise_scale`). They
stay on the gradients' device; the training loop reads them with its own periodic allreduce, so no step waits for
the host. Our engine counts them around its codec; DDP through `measured_hook`, around any hook (ours,
PyTorch's, or its plain allreduce).
"""

# No `from __future__ import annotations`: DDP checks that a hook's `bucket` annotation is the real class.
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist


class DenseFirst:
    """The first `steps` steps of every parameter are exchanged dense; `dense(keys)` counts one step of a bucket
    (by its parameters' numbers) and says whether it is one of them."""

    def __init__(self, steps: int):
        self.steps = steps
        self._done: dict[int, int] = {}  # parameter number → steps exchanged

    def dense(self, keys: tuple[int, ...]) -> bool:
        step = self._done.get(keys[0], 0) if keys else 0
        for key in keys:
            self._done[key] = step + 1
        return step < self.steps

    def wrap(self, codec_state: dict) -> dict:
        """A checkpoint's codec state with this policy's counts beside the codec's own."""
        return {"inner": codec_state, "done": dict(self._done)}

    def unwrap(self, state: dict) -> dict:
        """Take this policy's counts from a state `wrap` made; the codec's own state."""
        self._done = {int(k): int(v) for k, v in state["done"].items()}
        return state["inner"]


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
