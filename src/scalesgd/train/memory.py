"""What each rank holds: its peak memory (the process's resident set on a CPU, the allocator's peak on a GPU) and the
training state it keeps (parameters and optimizer state, a shard's where they are sharded), for the summary."""

from __future__ import annotations

import resource

import torch

from scalesgd.comm.wire.membership import Membership
from scalesgd.optim._batched import local

MB = 2**20


def state_bytes(optimizer) -> int:
    """The bytes of the parameters an optimizer steps and of its state (momenta, Adam's moments), this rank's own."""
    inner = getattr(optimizer, "optimizer", optimizer)  # our engine wraps the torch optimizer
    params = {id(p): p for group in inner.param_groups for p in group["params"]}
    tensors = local([*params.values(), *(v for state in inner.state.values() for v in state.values()
                                         if isinstance(v, torch.Tensor))])
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_bytes(device: torch.device) -> int:
    """This process's peak: the CUDA allocator's on a GPU, else the resident set's high-water mark (Linux: KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resident_bytes() -> int:
    """This process's resident set now (Linux): before training, what Python and torch hold whatever the run."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def per_rank(optimizer, device: torch.device, members: Membership, before: int = 0) -> dict:
    """Every member's peak, the part of it that was there `before` training (0 on a GPU: the allocator counts only
    tensors) and its state, in MiB, gathered (collective)."""
    mine = [peak_bytes(device) / MB, state_bytes(optimizer) / MB, 0.0 if device.type == "cuda" else before / MB]
    everyone = members.all_gather_object(mine)
    return {"peak_mb": [round(p, 1) for p, _, _ in everyone], "state_mb": [round(s, 2) for _, s, _ in everyone],
            "before_mb": [round(b, 1) for _, _, b in everyone]}
