"""A transformer language model trained as people train them today, with scalesgd's exchange as DDP's comm hook:
torchrun and DDP, bf16 autocast, micro-batches accumulated under `no_sync`, AdamW with no decay on biases, norms and
embeddings, warmup then cosine as one LambdaLR.

    torchrun --nproc-per-node 2 examples/transformer_ddp.py --codec fp8 --accumulate 2

The hook's codec starts dense and (top-k) ramps its density as `scalesgd train` does (`CodecHookState`'s defaults,
in steps); `--dense-steps` overrides the dense start. On GPUs: init with "nccl", move the model and batches to
`cuda:LOCAL_RANK`, autocast on "cuda"; nothing else changes.
"""

import argparse
import contextlib
import json
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from scalesgd import CodecHookState, codec_hook
from scalesgd.data.text import load_text_bundle
from scalesgd.models.gpt import GptOptions, gpt
from scalesgd.recipe import LrFactor, build_scheduler, param_groups


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", default="fp8", help="any scalesgd codec: fp16, bf16, fp8, topk, …")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward on each worker")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--dense-steps", type=int, default=None, help="dense start (default: the hook's)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)  # every rank starts from the same weights (DDP also broadcasts rank 0's)
    options = GptOptions(layers=2, heads=2, width=64, block=32)
    model = gpt(256, options)
    ddp = DistributedDataParallel(model)
    hook = CodecHookState(args.codec, model=model, compress_after=args.dense_steps)
    ddp.register_comm_hook(hook, codec_hook)

    text = load_text_bundle(None, options.block, samples=args.steps * args.micro_batch * args.accumulate * 2)
    data = TensorDataset(text.train.x, text.train.y)  # the Python standard library's own sources, as bytes
    loader = DataLoader(data, batch_size=args.micro_batch, sampler=DistributedSampler(data, seed=0), drop_last=True)
    optimizer = torch.optim.AdamW(param_groups(model, 0.1, bias_decay=False, embedding_decay=False), lr=args.lr,
                                  betas=(0.9, 0.95))
    schedule = build_scheduler(optimizer, LrFactor(total_steps=args.steps, steps_per_epoch=args.steps,
                                                   warmup="gradual", warmup_steps=args.steps // 10, start=0.1,
                                                   schedule="cosine"))

    losses, batches = [], iter(loader)
    for step in range(args.steps):
        total = torch.zeros(())
        for micro in range(args.accumulate):  # only the last micro-batch's backward exchanges
            x, y = next(batches)
            with ddp.no_sync() if micro < args.accumulate - 1 else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = ddp(x)
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                (loss / args.accumulate).backward()
            total += loss.detach() / args.accumulate
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        dist.all_reduce(total)
        losses.append(round(float(total) / dist.get_world_size(), 4))
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(text.test.x[:64]).float()
    val = torch.nn.functional.cross_entropy(logits.flatten(0, 1), text.test.y[:64].flatten())
    if dist.get_rank() == 0:
        print(json.dumps({"losses": losses, "codec": args.codec, "validation_loss": float(val),
                          "perplexity": math.exp(float(val)), "bytes_per_step": hook.bytes_sent / args.steps,
                          "parameters": sum(p.numel() for p in model.parameters()), "counters": hook.counters()}))
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
