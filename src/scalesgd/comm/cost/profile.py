"""What the planner needs, measured: per-layer forward/backward times, selection cost, message cost.

Layers are the model's trainable tensors in forward order (the engine's unit). Backward times come
from each tensor's gradient-ready moment (post-accumulate-grad hooks); sparsification time is the top-k
codec's own encode, fitted as a + b·d; communication is the sparse exchange of ⌈ρ·d⌉ entries on the
actual process group, fitted as α + β·d by least squares.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from scalesgd.comm.codecs.base import BucketView, Channel, Scratch
from scalesgd.comm.codecs.topk.codec import TopkCodec
from scalesgd.comm.engine.buckets import model_tensors
from scalesgd.comm.wire.compact import SPARSE_WIRES
from scalesgd.comm.wire.sparse import allgather_sparse, mean_of_sparse
from scalesgd.trace import DeviceClock, synchronize


@dataclass
class Profile:
    """Measured times (seconds) for one model, density and process group."""

    names: list[str]
    sizes: list[int]
    t_f: float
    t_b: list[float]
    comm: tuple[float, float]  # α, β: a message for a group of d elements takes α + β·d
    sparsify: tuple[float, float]  # a, b: selecting from d elements takes a + b·d (averaged over reuse)
    density: float
    reuse: int
    world_size: int

    def comm_time(self, d: int) -> float:
        return self.comm[0] + self.comm[1] * d if d else 0.0

    def sparsify_time(self, d: int) -> float:
        return self.sparsify[0] + self.sparsify[1] * d if d else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        return cls(**{**d, "comm": tuple(d["comm"]), "sparsify": tuple(d["sparsify"])})


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope, both clamped at 0 (a time never shrinks with size)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    slope = max(slope, 0.0)
    return max(my - slope * mx, 0.0), slope


def time_layers(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], loss_fn, iterations: int = 8,
                warmup: int = 2, group=None) -> tuple[float, list[float]]:
    """Median forward time (with the loss) and per-tensor backward times, forward order.

    In a process group every rank starts each iteration together (a barrier), so the times include
    the ranks competing for the machine's cores exactly as they do in training.
    """
    together = dist.is_available() and dist.is_initialized()
    params = [p for p in model.parameters() if p.requires_grad]
    clock = DeviceClock(params[0].device)
    ready: list = [None] * len(params)

    def stamp(i):
        def hook(_):
            ready[i] = clock.mark()
        return hook

    hooks = [p.register_post_accumulate_grad_hook(stamp(i)) for i, p in enumerate(params)]
    state = {k: v.clone() for k, v in model.state_dict().items()}  # BN statistics are put back after
    forwards, backwards = [], []
    try:
        x, y = batch
        for it in range(warmup + iterations):
            model.zero_grad(set_to_none=True)
            synchronize(params[0].device)
            if together:
                dist.barrier(group=group)
            start = clock.mark()
            loss = loss_fn(model(x), y)
            begin_backward = clock.mark()
            loss.backward()
            if it < warmup:
                continue
            forwards.append(clock.seconds(start, begin_backward))
            at = [clock.seconds(begin_backward, ready[i]) for i in range(len(params))]
            order = sorted(range(len(params)), key=lambda i: at[i])
            t_b, last = [0.0] * len(params), 0.0
            for i in order:
                t_b[i], last = at[i] - last, at[i]
            backwards.append(t_b)
    finally:
        for h in hooks:
            h.remove()
        model.load_state_dict(state)
        model.zero_grad(set_to_none=True)
    return statistics.median(forwards), [statistics.median(col) for col in zip(*backwards)]


def slowest_rank(t_f: float, t_b: list[float], group=None,
                 device: torch.device | str = "cpu") -> tuple[float, list[float]]:
    """The forward and backward times of the rank whose iteration is longest (collective).

    Every iteration waits for the slowest rank (the exchange and the buffer broadcast synchronise
    them), so that rank's times are the ones the iteration is made of.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return t_f, t_b
    mine = torch.tensor([t_f, *t_b], dtype=torch.float64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    slowest = max(everyone, key=lambda times: times.sum().item())
    return slowest[0].item(), slowest[1:].tolist()


def layer_profile(model: nn.Module, batch, loss_fn, group=None) -> dict:
    """The slowest rank's forward and per-tensor backward times with each tensor's name and size (collective):
    what `scalesgd simulate` reads as a compute profile."""
    device = next(model.parameters()).device
    t_f, t_b = slowest_rank(*time_layers(model, batch, loss_fn, group=group), group=group, device=device)
    tensors = model_tensors(model)
    shapes = [list(p.shape) for p in model.parameters() if p.requires_grad]
    return {"names": [t.name for t in tensors], "sizes": [t.numel for t in tensors], "shapes": shapes, "t_f": t_f,
            "t_b": t_b}


def time_sparsify(sizes: list[int], density: float, reuse: int, repeats: int = 3,
                  device: torch.device | str = "cpu", wire: str = "compact") -> tuple[float, float]:
    """Fit the top-k codec's encode time (one recompute per `reuse` steps) against bucket size."""
    xs, ys = [], []
    channel, scratch = Channel(None, 1), Scratch()
    for d in sizes:
        codec = TopkCodec("topk", density, reuse, wire=wire)
        g = torch.randn(d, device=device)
        view = BucketView(0, [], [0], d)
        per_step = []
        for step in range(reuse * repeats):
            copy = g.clone()
            synchronize(device)
            start = time.perf_counter()
            codec.start(copy, view, channel, scratch)
            synchronize(device)
            per_step.append(time.perf_counter() - start)
        xs.append(d)
        ys.append(statistics.mean(per_step))
    return fit_line(xs, ys)


def time_sparse_exchange(sizes: list[int], density: float, group=None, repeats: int = 3,
                         device: torch.device | str = "cpu", wire: str = "compact") -> tuple[float, float]:
    """Fit the sparse exchange of ⌈ρ·d⌉ entries per rank on `wire` and its decode against d, on `group`
    (collective)."""
    xs, ys = [], []
    for d in sizes:
        k = max(1, math.ceil(density * d))
        idx = torch.randperm(d)[:k].to(device=device, dtype=torch.int32)
        val, out = torch.randn(k, device=device).half().float(), torch.empty(d, device=device)
        times = []
        for _ in range(repeats + 1):
            synchronize(device)
            dist.barrier(group=group)
            start = time.perf_counter()
            gathered = allgather_sparse(idx, val, group, wire=SPARSE_WIRES[wire], numel=d)
            mean_of_sparse(out, gathered.indices, gathered.values)
            synchronize(device)
            times.append(time.perf_counter() - start)
        slowest = torch.tensor(statistics.median(times[1:]), dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        xs.append(d)
        ys.append(slowest.item())
    return fit_line(xs, ys)


def profile_model(model: nn.Module, batch, loss_fn, density: float, reuse: int, group=None,
                  wire: str = "compact") -> Profile:
    """Everything the planner needs for `model`, measured now on this rank and `group` (collective)."""
    device = next(model.parameters()).device
    layers = layer_profile(model, batch, loss_fn, group)
    total = sum(layers["sizes"])
    grid = sorted({max(1, min(total, d)) for d in (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)})
    sparsify = time_sparsify(grid, density, reuse, device=device, wire=wire)
    comm = time_sparse_exchange(grid, density, group, device=device, wire=wire)
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    return Profile(layers["names"], layers["sizes"], layers["t_f"], layers["t_b"], comm, sparsify, density,
                   reuse, world)
