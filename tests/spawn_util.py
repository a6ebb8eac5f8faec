"""Run a function on a few gloo workers on loopback (or one per GPU with NCCL beside gloo), as the multi-process
tests need."""

from __future__ import annotations

import datetime
import gc
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from scalesgd.runtime.process_group import exit_process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CUDA_BACKEND = "cpu:gloo,cuda:nccl"


def _entry(rank, fn, world_size, port, out_dir, args, backend, environ):
    os.environ.clear()
    os.environ.update(environ)  # the test's environment now, not the fork server's when it started
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                      RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    if "nccl" in backend:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(out_dir) / f"{rank}.pt")
    finally:
        if dist.is_initialized():  # unless the function tore it down itself, as a worker does
            dist.destroy_process_group()
    exit_process(0)  # as scalesgd's workers do: no interpreter teardown under gloo's threads


# Workers fork from one server process that has imported these already: each test's workers start in a fraction
# of the seconds a fresh interpreter takes to import torch (the server never initialises a process group or threads).
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "scalesgd.comm.engine", "scalesgd.comm.engine.exchange",
           "scalesgd.models", "tests.spawn_util"]


def run_workers(fn, world_size: int, *args, backend: str = "gloo"):
    """Call `fn(rank, world_size, *args)` in `world_size` new processes (gloo; `CUDA_BACKEND`: rank r on GPU r);
    return their results."""
    mp.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_entry, args=(fn, world_size, _free_port(), out, args, backend, dict(os.environ)),
                           nprocs=world_size, join=True, start_method="forkserver")
        return [torch.load(Path(out) / f"{r}.pt", weights_only=False) for r in range(world_size)]


def ddp_wrappers_at_destroy(rank, world, run):
    """How many DDP wrappers are alive when `run` (which ends with `process_group.close`) destroys the group."""
    seen = []
    destroy = dist.destroy_process_group

    def counting(*args, **kwargs):
        seen.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*args, **kwargs)

    dist.destroy_process_group = counting
    run(rank, world)
    return seen
