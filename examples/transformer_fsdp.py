"""The transformer trainer with its parameters, gradients and AdamW's state sharded across the workers (FSDP2),
the gradients' reduce-scatter through a scalesgd codec (`scalesgd-fsdp`): each rank holds 1/N of the model's state.

    torchrun --nproc-per-node 2 examples/transformer_fsdp.py --codec bf16 --accumulate 2

`--precision bf16` computes with bf16 copies of the fp32 shards (FSDP2's mixed precision). On GPUs: init with
"nccl" and move the model and batches to `cuda:LOCAL_RANK` before `shard_model`; nothing else changes.
"""

import argparse
import gc
import json
import math

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from scalesgd.comm.codecs import CODECS, CodecSettings
from scalesgd.comm.codecs.registry import SHARDED_ENGINE
from scalesgd.comm.engine.exchange import ExchangeSetup, build_exchange
from scalesgd.comm.engine.fsdp import shard_model
from scalesgd.data.text import load_text_bundle
from scalesgd.models.gpt import GptOptions, gpt
from scalesgd.recipe import LrFactor, build_scheduler, param_groups


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sharded = [name for name, entry in CODECS.items() if entry.runs_on(SHARDED_ENGINE)]
    parser.add_argument("--codec", default="bf16", choices=sharded,
                        help="what the gradients' reduce-scatter sends: a cast, fp8, or a codec summing each block's "
                             "whole gradients (top-k, low rank)")
    parser.add_argument("--precision", default="fp32", help="compute: fp32, or bf16 copies of the fp32 shards")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward on each worker")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    options = GptOptions(layers=2, heads=2, width=64, block=32)
    model = gpt(256, options)
    parameters = sum(p.numel() for p in model.parameters())
    shard_model(model, units=list(model.blocks), precision=args.precision)  # before the optimizer: it keeps shards
    optimizer = torch.optim.AdamW(param_groups(model, 0.1, bias_decay=False, embedding_decay=False), lr=args.lr,
                                  betas=(0.9, 0.95))
    exchange = build_exchange(SHARDED_ENGINE, model, optimizer,
                              ExchangeSetup(args.codec, CodecSettings(), clip_norm=1.0))
    schedule = build_scheduler(optimizer, LrFactor(total_steps=args.steps, steps_per_epoch=args.steps,
                                                   warmup="gradual", warmup_steps=args.steps // 10, start=0.1,
                                                   schedule="cosine"))
    text = load_text_bundle(None, options.block, samples=args.steps * args.micro_batch * args.accumulate * 2)
    data = TensorDataset(text.train.x, text.train.y)
    loader = DataLoader(data, batch_size=args.micro_batch, sampler=DistributedSampler(data, seed=0), drop_last=True)

    losses, batches, sent = [], iter(loader), 0
    for step in range(args.steps):
        total = torch.zeros(())
        for micro in range(args.accumulate):
            x, y = next(batches)
            with exchange.no_sync() if micro < args.accumulate - 1 else torch.enable_grad():  # the last one reduces
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                exchange.backward(loss / args.accumulate)
            total += loss.detach() / args.accumulate
        exchange.step()  # the mean gradient's norm clipped to 1 over the shards, then AdamW on this rank's shard
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        sent += exchange.stats().bytes_sent
        dist.all_reduce(total)
        losses.append(round(float(total) / dist.get_world_size(), 4))
    held = torch.tensor([sum(p.to_local().numel() for p in model.parameters())])  # (a forward leaves the root whole)
    model.eval()
    with torch.no_grad():
        val = torch.nn.functional.cross_entropy(model(text.test.x[:64]).flatten(0, 1), text.test.y[:64].flatten())
    everyone = [torch.zeros_like(held) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, held)
    if dist.get_rank() == 0:
        print(json.dumps({"losses": losses, "codec": args.codec, "validation_loss": float(val),
                          "perplexity": math.exp(float(val)), "parameters": parameters,
                          "held": [int(h) for h in everyone], "bytes_per_step": sent / args.steps}))
    del exchange, schedule, optimizer, model  # FSDP's state holds the process group: left alive to Python's exit,
    gc.collect()  # gloo's threads would free their last work (and its tensors) during it, which aborts the process
    dist.barrier()  # no rank tears its connections down under a peer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
