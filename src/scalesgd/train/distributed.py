"""Joining the process group: from our own launcher or from torchrun, on any backend."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalesgd.errors import PeerLost

_PEER_FAILURE_MARKS = ("gloo", "nccl", "connection reset", "connection closed", "connection refused",
                       "timed out", "broken pipe", "socket", "peer")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: global rank and size, and its place inside its node."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun(environ=os.environ) -> bool:
    """True when a launcher (torchrun or ours) already set RANK, WORLD_SIZE and MASTER_ADDR."""
    return all(k in environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init(timeout_s: float, threads: int = 0) -> DistEnv:
    """Create the default process group from the environment (env://), gloo on CPU or NCCL on CUDA."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // local_world))
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    env = DistEnv(rank, world, local_rank, local_world, device)
    warm_up(env)
    return env


def warm_up(env: DistEnv) -> None:
    """One small collective at start-up so connections exist before iteration 1 (SPEC §4)."""
    dist.all_reduce(torch.zeros(1, device=env.device))


def is_peer_failure(exc: BaseException) -> bool:
    """Whether an exception from a collective means another worker died or stopped answering."""
    if isinstance(exc, PeerLost) or isinstance(exc, getattr(dist, "DistError", ())):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _PEER_FAILURE_MARKS)


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s Python object on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def sync_buffers(module: torch.nn.Module, src: int = 0) -> None:
    """Give every rank rank `src`'s buffers (BN running statistics are per worker in training)."""
    for buf in module.buffers():
        dist.broadcast(buf, src)


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
