"""CPU a step of `lowrank-acp`'s exchange on vgg16 (rank 8, fp16 factors), a block of rows at a time against whole
matrices: `python docs/benchmarks/lowrank-blocks/cpu.py`.

Two gloo ranks on loopback, one compute thread each, exchange every bucket of the `size:1` plan as the engine does
(`BucketDriver.exchange`, gradients restored before each step): the median over 3 rounds of 16 steps of the CPU time a
step on each rank, blocks and whole matrices taking turns. "whole" is what an accelerator runs (`ROW_BLOCK` has no
entry for it), and what the CPU ran before."""

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scalesgd.comm.codecs import Channel, CodecSettings, LowrankOptions, make_codec
from scalesgd.comm.codecs.lowrank import codec as lowrank
from scalesgd.comm.engine.buckets import model_tensors, plan_buckets
from scalesgd.comm.engine.driver import BucketDriver
from scalesgd.models.vgg import vgg16

ROUNDS, STEPS = 3, 16
BLOCKS = {"blocks": lowrank.ROW_BLOCK["cpu"], "whole": None}


def worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = vgg16()
    params = list(model.parameters())
    plan = plan_buckets("size:1", model_tensors(model))
    runs = {}
    for name in BLOCKS:
        driver = BucketDriver(make_codec("lowrank-acp", CodecSettings(LowrankOptions(rank=8, factor_wire="fp16"))),
                              Channel(dist.new_group(), 2))
        driver.bind(params)
        buckets = []
        for index, members in enumerate(plan.buckets):
            tensors = [params[i] for i in members]
            offsets = [sum(p.numel() for p in tensors[:j]) for j in range(len(tensors))]
            numel = sum(p.numel() for p in tensors)
            grad = torch.randn(numel, generator=torch.Generator().manual_seed(100 * rank + index))
            buckets.append((grad, torch.empty(numel), driver.view(index, tensors, offsets, numel)))
        runs[name] = (driver, buckets)
    seconds = {name: [] for name in BLOCKS}
    for r in range(ROUNDS + 1):  # the first round warms up
        for name, (driver, buckets) in runs.items():
            lowrank.ROW_BLOCK["cpu"] = BLOCKS[name]
            dist.barrier()
            spent = 0.0
            for _ in range(STEPS):
                for grad, flat, view in buckets:
                    flat.copy_(grad)
                    start = time.thread_time()
                    driver.exchange(flat, view)
                    spent += time.thread_time() - start
            if r:
                seconds[name].append(spent / STEPS)
    for name, values in seconds.items():
        print(f"rank {rank}, {name}: {statistics.median(values) * 1e3:.1f} ms of CPU a step "
              f"(rounds {min(values) * 1e3:.1f}–{max(values) * 1e3:.1f})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(29500 + os.getpid() % 1000,), nprocs=2)
