"""Process groups of our own (the exchange's, the DDP hook's) that time out when the caller said: torch's
`dist.new_group` gives a new group the backend's default timeout (30 minutes on gloo), not the one given to
`init_process_group`, so ranks that wait on each other in it would hang that long without a word."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def caller_timeout(group=None) -> timedelta | None:
    """The timeout of `group` (the default group: what `init_process_group` was given); None where torch keeps it
    out of reach."""
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    for device in group._device_types:
        try:
            timeout = group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError):  # a backend without torch's options (a plugin's)
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return None


def own_group(ranks: list[int] | None = None, backend: str | None = None):
    """A new process group (collective over the default group: every rank calls it) with the default group's
    timeout."""
    return dist.new_group(ranks, timeout=caller_timeout(), backend=backend)
