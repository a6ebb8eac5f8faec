"""The same transformer trainer without DDP: each worker steps alone, and scalesgd's DiLoCo synchronises every
`--local-steps` steps, the pseudo-gradient through any codec (a hook on the inner optimizer: the loop is the user's).

    torchrun --nproc-per-node 2 examples/transformer_diloco.py --local-steps 10 --codec fp8

Streaming DiLoCo: `--fragments 2 --overlap-steps 2` (one fragment every local-steps/2 steps, its exchange behind the
next 2 steps). On GPUs: init with "nccl", move the model and batches to `cuda:LOCAL_RANK`, autocast on "cuda".
"""

import argparse
import json
import math

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from scalesgd.data.text import load_text_bundle
from scalesgd.models.gpt import GptOptions, gpt
from scalesgd.periodic import DiLoCo
from scalesgd.recipe import LrFactor, build_scheduler, param_groups


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--codec", default="fp32", help="the pseudo-gradient's codec: fp32, fp16, fp8, topk, …")
    parser.add_argument("--local-steps", type=int, default=10, help="inner steps between synchronisations (H)")
    parser.add_argument("--fragments", type=int, default=1, help="Streaming DiLoCo's fragments")
    parser.add_argument("--overlap-steps", type=int, default=0, help="inner steps an exchange runs behind (τ)")
    parser.add_argument("--steps", type=int, default=40, help="inner optimizer steps")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward on each worker")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    options = GptOptions(layers=2, heads=2, width=64, block=32)
    model = gpt(256, options)
    text = load_text_bundle(None, options.block, samples=args.steps * args.micro_batch * args.accumulate * 2)
    data = TensorDataset(text.train.x, text.train.y)
    loader = DataLoader(data, batch_size=args.micro_batch, sampler=DistributedSampler(data, seed=0), drop_last=True)
    inner = torch.optim.AdamW(param_groups(model, 0.1, bias_decay=False, embedding_decay=False), lr=args.lr,
                              betas=(0.9, 0.95))
    schedule = build_scheduler(inner, LrFactor(total_steps=args.steps, steps_per_epoch=args.steps, warmup="gradual",
                                               warmup_steps=args.steps // 10, start=0.1, schedule="cosine"))

    losses, batches = [], iter(loader)
    with DiLoCo(model, inner, args.local_steps, codec=args.codec, fragments=args.fragments,
                overlap_steps=args.overlap_steps) as diloco:  # starts every rank from rank 0's weights
        for step in range(args.steps):
            total = torch.zeros(())
            for _ in range(args.accumulate):  # no no_sync needed: nothing is exchanged in backward
                x, y = next(batches)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                (loss / args.accumulate).backward()
                total += loss.detach() / args.accumulate
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            inner.step()  # every --local-steps steps, DiLoCo's hook synchronises here
            inner.zero_grad(set_to_none=True)
            schedule.step()
            losses.append(round(float(total), 4))  # this worker's own loss: no collective in the loop
        diloco.finish()  # every rank now holds the global parameters
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(text.test.x[:64]).float()
    val = torch.nn.functional.cross_entropy(logits.flatten(0, 1), text.test.y[:64].flatten())
    checksum = torch.tensor([sum(float(p.double().sum()) for p in model.parameters())], dtype=torch.float64)
    sums = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(sums, checksum)
    if dist.get_rank() == 0:
        print(json.dumps({"losses": losses, "codec": args.codec, "validation_loss": float(val),
                          "perplexity": math.exp(float(val)), "rounds": diloco.rounds,
                          "bytes_sent": diloco.bytes_sent, "parameters": sum(p.numel() for p in model.parameters()),
                          "ranks_agree": all(float(s) == float(sums[0]) for s in sums)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
