"""Futures a DDP communication hook hands back: made for the bucket's device, settled on a worker thread."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch


def new_future(device: torch.device | None = None) -> torch.futures.Future:
    """A future DDP can wait on for a bucket on `device` (CUDA futures carry their device)."""
    return torch.futures.Future(devices=[device] if device is not None and device.type == "cuda" else None)


def settle(future: torch.futures.Future, work: Callable[[], torch.Tensor]) -> None:
    """Set `future` to `work()`, or to its error, which DDP raises where backward waits on the future."""
    try:
        future.set_result(work())
    except BaseException as err:  # DDP re-raises it when backward waits on the future
        future.set_exception(err)


def on_thread(worker: ThreadPoolExecutor, work: Callable[[], torch.Tensor],
              device: torch.device | None = None) -> torch.futures.Future:
    """A DDP hook's future for `work()` run on `worker` (one thread: buckets in the order DDP hands them over)."""
    future = new_future(device)
    worker.submit(settle, future, work)
    return future
