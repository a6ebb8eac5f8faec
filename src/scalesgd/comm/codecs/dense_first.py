"""Compression that starts late: the exchange is dense (fp32) for a run's first steps, as PowerSGD's start
iteration is, so a lossy codec never meets the large, fast-changing gradients of the first iterations."""

from __future__ import annotations

import torch

from scalesgd.comm.codecs.base import BucketView, Channel, Codec


class DenseFirst(Codec):
    """`inner` after `steps` dense steps; steps are counted per parameter tensor, so DDP's bucket rebuild and a
    resume keep the count."""

    def __init__(self, inner: Codec, steps: int):
        self.inner, self.steps = inner, steps
        self.name, self.needs_topology = inner.name, inner.needs_topology
        self.encode_in_backward = inner.encode_in_backward
        self._done: dict[int, int] = {}  # number → steps exchanged
        self._dense: dict[int, bool] = {}  # bucket → dense this step

    def bind(self, params: list[torch.Tensor]) -> None:
        super().bind(params)
        self.inner.bind(params)

    def encode(self, flat: torch.Tensor, bucket: BucketView, channel: Channel) -> torch.Tensor:
        numbers = [self.key(p) for p in bucket.params]
        step = self._done.get(numbers[0], 0)
        for number in numbers:
            self._done[number] = step + 1
        self._dense[bucket.index] = step < self.steps
        if self._dense[bucket.index]:
            return flat.div_(channel.world_size)
        return self.inner.encode(flat, bucket, channel)

    def communicate(self, wire: torch.Tensor, bucket: BucketView, channel: Channel) -> int:
        if self._dense[bucket.index]:
            return channel.allreduce(wire)
        return self.inner.communicate(wire, bucket, channel)

    def decode(self, wire: torch.Tensor, bucket: BucketView, out: torch.Tensor, channel: Channel) -> None:
        if not self._dense[bucket.index]:
            self.inner.decode(wire, bucket, out, channel)
            return
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
        self.inner.after_dense(out, bucket)

    def counters(self) -> dict[str, float]:
        return self.inner.counters()

    def pop_notices(self) -> list[tuple[torch.Tensor, str]]:
        return self.inner.pop_notices()

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "done": dict(self._done)}

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self._done = {int(k): int(v) for k, v in state["done"].items()}
