"""The whole large-minibatch recipe in your own script: plain torchrun and DDP, scalesgd's fp8 exchange as DDP's
comm hook, scalesgd's LARS, linear scaling with gradual warmup as one LambdaLR, label smoothing, no weight decay
on biases, one shuffle split among the workers.

    torchrun --nproc-per-node 2 examples/torchrun_ddp.py --epochs 8

On GPUs: init with "nccl", move the model and batches to `cuda:LOCAL_RANK`; nothing else changes.
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from scalesgd import CodecHookState, codec_hook
from scalesgd.optim import LARS
from scalesgd.recipe import LrFactor, build_scheduler, param_groups, scaled_lr


def teacher_task(samples=4096, features=32, classes=10):
    """Inputs labelled by a fixed random linear teacher: a task a small MLP learns in a few epochs."""
    g = torch.Generator().manual_seed(0)
    x, teacher = torch.randn(samples, features, generator=g), torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--codec", default="fp8", help="any scalesgd codec: fp16, bf16, fp8, topk, lags, …")
    parser.add_argument("--batch-per-worker", type=int, default=128)
    parser.add_argument("--base-lr", type=float, default=0.1, help="the rate tuned at --base-batch")
    parser.add_argument("--base-batch", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun gave RANK, WORLD_SIZE and the rendezvous address
    world = dist.get_world_size()
    torch.manual_seed(0)  # every rank starts from the same weights (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = DistributedDataParallel(model)
    # per-parameter codec state keyed by the model's order; fp8 needs no dense start (a sparse codec would keep the
    # default: dense through the LR warmup, as `scalesgd train --compress-after warmup`)
    hook = CodecHookState(args.codec, model=model, compress_after=0)
    ddp.register_comm_hook(hook, codec_hook)

    data = teacher_task()
    sampler = DistributedSampler(data, seed=0)  # one shuffle per epoch, split among the workers
    loader = DataLoader(data, batch_size=args.batch_per_worker, sampler=sampler, drop_last=True)
    global_batch = args.batch_per_worker * world
    lr = scaled_lr(args.base_lr, global_batch, args.base_batch, "linear")  # kη for a k times larger batch
    optimizer = LARS(param_groups(model, weight_decay=5e-4, bias_decay=False), lr=lr, momentum=0.9,
                     trust_coefficient=0.02)
    steps = len(loader) * args.epochs
    schedule = build_scheduler(optimizer, LrFactor(  # gradual warmup from η to kη over 2 epochs, then cosine
        total_steps=steps, steps_per_epoch=len(loader), warmup="gradual", warmup_steps=2 * len(loader),
        start=args.base_lr / lr, schedule="cosine"))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)  # the mean over this worker's batch; DDP averages over workers
            loss.backward()  # buckets go through the hook as backward produces them
            optimizer.step()
            schedule.step()
            total += torch.stack([loss.detach(), torch.tensor(1.0)])
        dist.all_reduce(total)
        losses.append(round(float(total[0] / total[1]), 4))
    counters = hook.counters()
    if dist.get_rank() == 0:
        print(json.dumps({"losses": losses, "codec": args.codec, "world": world, "steps": steps,
                          "parameters": sum(p.numel() for p in model.parameters()),
                          "bytes_per_step": hook.bytes_sent / steps, "counters": counters}))
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
