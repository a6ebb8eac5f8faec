"""PyTorch's own DDP communication hooks, as a user of DDP gets them: the baselines every speed claim is against."""

# No `from __future__ import annotations`: DDP checks a hook's `bucket` annotation, which must not be a string.
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from scalesgd.comm.wire.futures import on_thread

POWERSGD_RANK = 4
POWERSGD_START_ITER = 10  # plain allreduce for the first 10 iterations, PyTorch's documented warm start


@dataclass
class DdpHook:
    """A comm hook and its state for `DistributedDataParallel.register_comm_hook`, and the bucket size DDP needs."""

    state: object
    hook: Callable
    bucket_cap_mb: float | None = None  # None: DDP's default

    def close(self) -> None:
        """Stop the thread the hook's state runs on, if it has one."""
        if hasattr(self.state, "close"):
            self.state.close()


class InOrder:
    """A hook that issues collectives from its futures' callbacks (PowerSGD: P's allreduce, then Q's), run bucket
    after bucket on one thread. On gloo, ranks must issue a group's collectives in the same order; with several
    buckets in flight, callbacks on gloo's threads interleave differently on each rank ("Received data size
    doesn't match"). One bucket's whole chain before the next keeps the order and still overlaps backward."""

    def __init__(self, state, hook: Callable):
        self.state, self.hook = state, hook
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scalesgd-hook-in-order")

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def in_order_hook(ordered: InOrder, bucket):
    """Run `ordered.hook` on the bucket on the ordering thread, waiting for its whole chain; its result."""
    return on_thread(ordered._worker, lambda: ordered.hook(ordered.state, bucket).wait())


def allreduce(state, bucket):
    """DDP's own allreduce (the mean), as a hook: what runs without one, for wrapping."""
    return default_hooks.allreduce_hook(state, bucket)


def builtin(on_cuda: bool, settings=None) -> None:
    """No hook: DDP's own fp32 allreduce."""
    return None


def fp16(on_cuda: bool, settings=None) -> DdpHook:
    return DdpHook(None, default_hooks.fp16_compress_hook)


def bf16(on_cuda: bool, settings=None) -> DdpHook:
    return DdpHook(None, default_hooks.bf16_compress_hook)


def powersgd(on_cuda: bool, settings=None) -> DdpHook:
    """PowerSGD at the lowrank family's `--rank` (4 by default) and its min_compression_rate after 10 plain iterations,
    in DDP's default buckets; on gloo its chains run in order."""
    options = settings.options["lowrank"] if settings is not None else None
    state = powerSGD_hook.PowerSGDState(process_group=None,
                                        matrix_approximation_rank=options.rank if options else POWERSGD_RANK,
                                        min_compression_rate=options.min_rate if options else 2,
                                        start_powerSGD_iter=POWERSGD_START_ITER)
    if on_cuda:
        return DdpHook(state, powerSGD_hook.powerSGD_hook)
    return DdpHook(InOrder(state, powerSGD_hook.powerSGD_hook), in_order_hook)
