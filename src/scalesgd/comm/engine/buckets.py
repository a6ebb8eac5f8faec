"""Bucket plans: which gradients travel together, in the order back-propagation produces them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table


MB = 1 << 20
Grouping = list[list[int]]  # layer indices, groups in backward order: [[5, 4], [3], [2, 1, 0]]
PLAN_KINDS = ("size:MB", "growing[:FIRST_MB[:FACTOR]]", "layer", "single")


@dataclass(frozen=True)
class TensorInfo:
    """One trainable tensor as a plan sees it: its name, element count and bytes per element."""

    name: str
    numel: int
    element_size: int = 4

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True)
class BucketPlan:
    """Buckets of tensor indices (into the forward-order tensor list), listed in backward order."""

    spec: str
    tensors: tuple[TensorInfo, ...]
    buckets: tuple[tuple[int, ...], ...]

    def bucket_bytes(self, b: int) -> int:
        return sum(self.tensors[i].nbytes for i in self.buckets[b])

    def to_dict(self) -> dict:
        return {"spec": self.spec, "buckets": [
            {"tensors": [self.tensors[i].name for i in bucket], "numel": sum(self.tensors[i].numel for i in bucket),
             "bytes": self.bucket_bytes(b)} for b, bucket in enumerate(self.buckets)]}

    def table(self):
        """A rich table: one row per bucket, first exchanged first."""
        table = Table(title=f"bucket plan {self.spec}: {len(self.buckets)} buckets, "
                            f"{sum(t.nbytes for t in self.tensors) / MB:.2f} MB")
        for column in ("#", "tensors", "first → last (backward order)", "elements", "MB"):
            table.add_column(column, justify="left" if column.startswith("first") else "right")
        for b, bucket in enumerate(self.buckets):
            names = self.tensors[bucket[0]].name
            if len(bucket) > 1:
                names += f" → {self.tensors[bucket[-1]].name}"
            table.add_row(str(b), str(len(bucket)), names, f"{sum(self.tensors[i].numel for i in bucket):,}",
                          f"{self.bucket_bytes(b) / MB:.3f}")
        return table


def parse_spec(spec: str) -> tuple[str, tuple[float, ...]]:
    """Split a plan spec into its kind and numbers; ValueError naming the accepted forms."""
    kind, *args = spec.split(":")
    try:
        numbers = tuple(float(a) for a in args)
    except ValueError:
        numbers = (-1.0,)
    ok = (kind == "size" and len(numbers) == 1 and numbers[0] > 0) or \
         (kind == "growing" and len(numbers) <= 2 and all(n > 0 for n in numbers) and
          (len(numbers) < 2 or numbers[1] >= 1)) or \
         (kind in ("layer", "single") and not numbers)
    if not ok:
        raise ValueError(f"bucket plan {spec!r} is not valid; use one of {', '.join(PLAN_KINDS)} "
                         f"(MB > 0, FACTOR >= 1)")
    return kind, numbers


def check_grouping(groups: Sequence[Sequence[int]], layers: int) -> None:
    """ValueError unless `groups` covers L−1 … 0 once, in backward order, each group consecutive."""
    flat = [i for g in groups for i in g]
    if flat != list(range(layers - 1, -1, -1)) or any(not g for g in groups):
        raise ValueError(f"a grouping must list layers {layers - 1} … 0 once each in backward order, "
                         f"in non-empty groups; got {[list(g) for g in groups]}")


def spec_problem(spec: str) -> str | None:
    """What is wrong with a plan spec, or None: the check of every option that takes one."""
    try:
        parse_spec(spec)
    except ValueError as err:
        return str(err)
    return None


def plan_buckets(spec: str, tensors: list[TensorInfo]) -> BucketPlan:
    """Group `tensors` (forward order) into buckets following `spec`.

    size:MB — consecutive tensors in backward order until a bucket holds at least MB megabytes
    (Goyal et al. 2017: "each allreduce carries >= 1 MB"); growing — Honda et al. (Fujitsu)'s grouping: the first bucket
    (nearest the output) targets FIRST_MB (default 0.25) and each next one FACTOR (default 2) times
    more, so the first exchange starts after a few layers of backward and the layers nearest the
    input travel in few large messages; layer — one tensor per exchange; single — one exchange after
    the whole backward.
    """
    kind, numbers = parse_spec(spec)
    order = list(range(len(tensors)))[::-1]
    if kind == "layer":
        buckets = [[i] for i in order]
    elif kind == "single":
        buckets = [order] if order else []
    else:
        if kind == "size":
            targets = _constant(numbers[0] * MB)
        else:
            first, factor = (numbers + (0.25, 2.0)[len(numbers):])[:2]
            targets = _geometric(first * MB, factor)
        buckets = _fill(order, tensors, targets)
    return BucketPlan(spec, tuple(tensors), tuple(tuple(b) for b in buckets))


def ddp_buckets(tensors: list[TensorInfo], cap_mb: float = 25.0, first_mb: float = 1.0) -> BucketPlan:
    """The buckets PyTorch DDP builds: the first (nearest the output) closes at `first_mb`, the others at `cap_mb`."""
    def targets():
        yield first_mb * MB
        yield from _constant(cap_mb * MB)

    order = list(range(len(tensors)))[::-1]
    return BucketPlan(f"ddp:{cap_mb:g}", tuple(tensors), tuple(tuple(b) for b in _fill(order, tensors, targets())))


def plan_from_groups(groups: list[list[int]], tensors: list[TensorInfo], spec: str) -> BucketPlan:
    """A plan whose buckets are a planner's groups (backward order, consecutive tensor indices)."""
    check_grouping(groups, len(tensors))
    return BucketPlan(spec, tuple(tensors), tuple(tuple(g) for g in groups))


def _constant(target: float):
    while True:
        yield target


def _geometric(first: float, factor: float):
    target = first
    while True:
        yield target
        target *= factor


def _fill(order: list[int], tensors: list[TensorInfo], targets) -> list[list[int]]:
    """Close a bucket as soon as it reaches its target size; the next bucket takes the next target."""
    buckets, current, size, target = [], [], 0, next(targets)
    for i in order:
        current.append(i)
        size += tensors[i].nbytes
        if size >= target:
            buckets.append(current)
            current, size, target = [], 0, next(targets)
    if current:
        buckets.append(current)
    return buckets


def model_tensors(model) -> list[TensorInfo]:
    """The trainable tensors of `model` in forward (registration) order, as the engine buckets them."""
    return [TensorInfo(name, p.numel(), p.element_size()) for name, p in model.named_parameters()
            if p.requires_grad]
