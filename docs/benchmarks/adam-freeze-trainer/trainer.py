"""A user's own char-level GPT trainer of the common open-source kind, with scalesgd's hook registered as
docs/hooks.md shows: torchrun and DDP, AdamW with β2 = 0.99, 20 iterations of linear LR warm-up then cosine to a
tenth, 4 micro-batches under `no_sync`, gradient clipping, 240 iterations; fp32 (this CPU times fp32).

    torchrun --nproc-per-node 2 trainer.py --exchange onebit --freeze default --seed 0

--exchange ddp: plain DDP; onebit: 1-bit Adam (`CodecHookState("onebit")` and `OneBitAdam`); topk-momentum: top-k
ρ 0.01 carrying Adam's momentum (`TopkOptions(momentum_correction=True)` and `OneBitAdam`). --freeze warmup: the dense
start and the variance freeze at the LR warm-up's end (20 iterations, what the docs used to suggest); default:
`OneBitAdam`'s own default (Adam's averaging horizon 1/(1 − β2) = 100), the hook's dense start ending there. Rank 0
prints one JSON line: the validation loss over 16 held-out batches.
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
from scalesgd.comm.codecs import CodecSettings, TopkOptions
from scalesgd.data.text import load_text_bundle
from scalesgd.models.gpt import GptOptions, gpt
from scalesgd.optim import OneBitAdam
from scalesgd.recipe import param_groups

ITERS, WARMUP, ACCUMULATE, MICRO, LR, BETAS = 240, 20, 4, 8, 1e-3, (0.9, 0.99)


def rate(it: int) -> float:
    """nanoGPT's schedule: linear warm-up, then cosine down to a tenth."""
    if it < WARMUP:
        return LR * (it + 1) / WARMUP
    progress = (it - WARMUP) / (ITERS - WARMUP)
    return LR / 10 + 0.5 * (1 + math.cos(math.pi * progress)) * (LR - LR / 10)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchange", choices=("ddp", "onebit", "topk-momentum"), default="ddp")
    parser.add_argument("--freeze", choices=("warmup", "default"), default="default")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(args.seed)
    options = GptOptions()  # 4 blocks, width 128, context 64
    model = gpt(256, options)
    ddp = DistributedDataParallel(model)
    groups = param_groups(model, 0.1, bias_decay=False, embedding_decay=False)
    freeze = WARMUP if args.freeze == "warmup" else None
    if args.exchange == "ddp":
        optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS)
        hook = None
    else:
        optimizer = OneBitAdam(groups, lr=LR, betas=BETAS, freeze_step=freeze)  # None: Adam's horizon
        settings = CodecSettings() if args.exchange == "onebit" else CodecSettings(
            TopkOptions(density=0.01, momentum_correction=True), momentum=BETAS[0], momentum_average=True)
        codec = "onebit" if args.exchange == "onebit" else "topk"
        hook = CodecHookState(codec, settings=settings, model=model, compress_after=optimizer.freeze_step)
        ddp.register_comm_hook(hook, codec_hook)

    text = load_text_bundle(None, options.block, samples=ITERS * MICRO * ACCUMULATE * dist.get_world_size())
    data = TensorDataset(text.train.x, text.train.y)  # the Python standard library's own sources, as bytes
    loader = DataLoader(data, batch_size=MICRO, sampler=DistributedSampler(data, seed=args.seed), drop_last=True)
    batches = iter(loader)
    for it in range(ITERS):
        for group in optimizer.param_groups:
            group["lr"] = rate(it)
        for micro in range(ACCUMULATE):  # only the last micro-batch's backward exchanges
            x, y = next(batches)
            with ddp.no_sync() if micro < ACCUMULATE - 1 else contextlib.nullcontext():
                loss = torch.nn.functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
                (loss / ACCUMULATE).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        x, y = text.test.x[:16 * 64], text.test.y[:16 * 64]
        val = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    if dist.get_rank() == 0:
        print(json.dumps({"exchange": args.exchange, "freeze": args.freeze, "seed": args.seed,
                          "freeze_step": getattr(optimizer, "freeze_step", None), "validation_loss": float(val),
                          "bytes_per_step": hook.bytes_sent / ITERS if hook else None}))
    if hook is not None:
        hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
