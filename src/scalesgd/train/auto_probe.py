"""What `--exchange auto` measures on the real process group before it simulates anything: what a bucket costs the
communication thread while backward computes beside it, and what each candidate codec's exchange costs beyond its
modelled wire, for real, on buckets of two sizes (collective: every rank measures, the slowest rank's figures count)."""

from __future__ import annotations

import math
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from scalesgd.comm.codecs import Channel, CodecSettings, make_codec
from scalesgd.comm.cost.profile import fit_line
from scalesgd.comm.engine.driver import BucketDriver
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.exchange import Costs, sent_sizes
from scalesgd.sim.modes import Mode
from scalesgd.sim.network import Cluster
from scalesgd.sim.wire import wire_time
from scalesgd.train.auto_rank import candidate_mode

PROBE_SIZES = (1 << 12, 1 << 22)  # the buckets each candidate codec exchanges for real: 16 KB and 16 MB of fp32
PROBE_REPEATS = 2
HANDOFF_ELEMENTS, HANDOFF_BUCKETS = 1024, 16  # small buckets exchanged while backward runs


def contended_bucket_cost(model: nn.Module, batch, loss_fn, channel: Channel, cluster: Cluster) -> float:
    """What one more bucket costs the channel while backward computes beside it, beyond its wire (collective).

    The engine's communication thread wakes once per bucket; where compute holds the cores, each wake-up
    waits for them. Small fp32 buckets are exchanged on a thread while this thread runs forward and backward,
    as in training; the model's state (BN statistics) is put back after.
    """
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = batch
    bucket = torch.randn(HANDOFF_ELEMENTS, device=x.device)
    took: list[float] = []

    def exchange() -> None:
        start = time.perf_counter()
        for _ in range(HANDOFF_BUCKETS):
            channel.allreduce(bucket.clone())
        took.append(time.perf_counter() - start)

    dist.barrier(group=channel.group)
    worker = threading.Thread(target=exchange, name="scalesgd-auto-probe")
    worker.start()
    loss_fn(model(x), y).backward()
    while worker.is_alive():  # compute for as long as the exchanges take
        loss_fn(model(x), y).backward()
    worker.join()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)
    wire = wire_time(Mode("fp32", "scalesgd", "fp32", channel.algorithm), HANDOFF_ELEMENTS, cluster)
    per_bucket = torch.tensor([max(took[0] / HANDOFF_BUCKETS - wire, 0.0)], dtype=torch.float64)
    dist.all_reduce(per_bucket, op=dist.ReduceOp.MAX, group=channel.group)
    return per_bucket.item()


def probe(codec_name: str, settings: CodecSettings, channel: Channel, cluster: Cluster, compute: ComputeProfile,
          device) -> Costs:
    """Buckets of two sizes exchanged for real with `codec_name`: what a bucket costs beyond the modelled wire, as a
    fixed part and a part per element, and the CPU the whole model's exchange would take (the slowest rank's;
    collective). Each bucket holds one square-ish matrix, which a low-rank codec factors."""
    mode = candidate_mode(codec_name, settings, channel.algorithm, "single")
    sizes = sorted({max(1, min(n, compute.numel)) for n in PROBE_SIZES})
    beyond, inline, cpu = [], 0.0, 0.0
    for numel in sizes:
        shape = matrix_shape(numel)
        took_inline, took, took_cpu = _exchange_for_real(codec_name, settings, channel, shape, device)
        sent = sent_sizes(mode, ComputeProfile(("probe",), (numel,), 0.0, (0.0,), 0.0, 1, shapes=(shape,)))[0]
        beyond.append(max(took - took_inline - wire_time(mode, sent, cluster), 0.0))
        inline, cpu = took_inline / numel, took_cpu / numel  # the largest bucket's, per element
    per_bucket, per_element = fit_line(sizes, beyond) if len(sizes) > 1 else (0.0, beyond[0] / sizes[0])
    return Costs(per_element, inline, cpu * compute.numel, per_bucket)


def matrix_shape(numel: int) -> tuple[int, int]:
    """A probe's `numel` elements as a matrix, rows a power of two up to its square root (a low-rank codec factors
    it as it would a layer's weight)."""
    rows = math.gcd(numel, 1 << (max(numel.bit_length() - 1, 0) // 2))
    return (rows, numel // rows)


def _exchange_for_real(codec_name: str, settings: CodecSettings, channel: Channel, shape: tuple[int, ...],
                       device) -> tuple[float, float, float]:
    """Seconds on backward's path, in all, and of process CPU for one bucket holding one tensor of `shape` (slowest
    rank's, collective).

    Each repeat starts from a fresh codec: the same gradient fed twice would double a sparse codec's residual
    and send many times its density. A codec that reuses its threshold computes the exact top-k on one step
    in `reuse`: that share of the selection is taken out of the times.
    """
    weight = torch.randn(shape, device=device)
    numel = weight.numel()
    gradient = torch.randn(numel, device=device) * 1e-3
    inline = total = cpu = 0.0
    for repeat in range(PROBE_REPEATS + 1):  # the first warms the codec up (kernels, scales)
        codec = make_codec(codec_name, settings)
        driver = BucketDriver(codec, channel)
        view = driver.view(0, [weight], [0], numel)
        flat = gradient.clone()
        dist.barrier(group=channel.group)
        start, cpu_start = time.perf_counter(), time.process_time()
        pending = driver.prepare(flat, view)
        encoded = time.perf_counter()
        driver.complete(pending)
        end, cpu_end = time.perf_counter(), time.process_time()
        saved = _reused_share(codec, gradient)
        if repeat:
            inline += (encoded - start - saved) if codec.encode_in_backward else 0.0
            total += end - start - saved
            cpu += cpu_end - cpu_start - saved
    measured = torch.tensor([inline, total, cpu], dtype=torch.float64) / PROBE_REPEATS
    dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=channel.group)
    return tuple(max(t, 0.0) for t in measured.tolist())


def _reused_share(codec, gradient: torch.Tensor) -> float:
    """The exact top-k's time a codec reusing its threshold for `reuse` steps saves on average per step."""
    reuse = getattr(codec, "reuse", 1)
    if reuse <= 1:
        return 0.0
    start = time.perf_counter()
    torch.topk(gradient.abs(), codec.k(gradient.numel()), sorted=False)
    return (time.perf_counter() - start) * (reuse - 1) / reuse
