"""A codec run on one bucket as the engines run it: through a `BucketDriver`, pieces pipelined."""

import itertools

import torch

from scalesgd.comm.codecs import BucketView, Channel, Codec
from scalesgd.comm.engine.driver import BucketDriver


def view_of(params: list[torch.Tensor], index: int = 0) -> BucketView:
    """A bucket of `params` laid out in order, numbered 0, 1, … as a bound model would number them."""
    offsets = list(itertools.accumulate((p.numel() for p in params[:-1]), initial=0)) if params else []
    return BucketView(index, params, offsets, sum(p.numel() for p in params), tuple(range(len(params))))


def exchange(codec: Codec, flat: torch.Tensor, view: BucketView, channel: Channel) -> int:
    """Replace `flat` by the mean over ranks with `codec`; the bytes sent."""
    return BucketDriver(codec, channel).exchange(flat, view)


class Unscaled:
    """fp16's gradient scaler as the driver sees it, at scale 1: a step whose sum is not finite is skipped."""

    def get_scale(self) -> float:
        return 1.0

    def is_enabled(self) -> bool:
        return True


def same_state(a, b) -> bool:
    """Nested states equal value by value (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, type(a)) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b
