"""PyTorch's own DDP communication hooks, as a user of DDP gets them: the baselines every speed claim is against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

POWERSGD_RANK = 4
POWERSGD_START_ITER = 10  # plain allreduce for the first 10 iterations, PyTorch's documented warm start
# PowerSGD's hook issues its later allreduces from future callbacks; with several DDP buckets in
# flight, gloo ranks can issue them in different orders ("Received data size doesn't match
# expected size"). One bucket keeps a single chain in flight, so the baseline runs on gloo.
POWERSGD_GLOO_BUCKET_MB = 1024


@dataclass
class DdpHook:
    """A comm hook and its state for `DistributedDataParallel.register_comm_hook`, and the bucket size DDP needs."""

    state: object
    hook: Callable
    bucket_cap_mb: float | None = None  # None: DDP's default


def builtin(on_cuda: bool) -> None:
    """No hook: DDP's own fp32 allreduce."""
    return None


def fp16(on_cuda: bool) -> DdpHook:
    return DdpHook(None, default_hooks.fp16_compress_hook)


def bf16(on_cuda: bool) -> DdpHook:
    return DdpHook(None, default_hooks.bf16_compress_hook)


def powersgd(on_cuda: bool) -> DdpHook:
    """PowerSGD at rank 4 after 10 plain iterations; one bucket on gloo (see POWERSGD_GLOO_BUCKET_MB)."""
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                        start_powerSGD_iter=POWERSGD_START_ITER)
    return DdpHook(state, powerSGD_hook.powerSGD_hook, None if on_cuda else POWERSGD_GLOO_BUCKET_MB)
