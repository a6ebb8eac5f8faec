"""What periodic synchronisation costs a worker besides its exchange: the step time of a GPT under bf16 AdamW alone,
and with DiLoCo (H = 10) around it through fp32, fp8 and top-k, its landing steps (Δ, the codec's arithmetic, the
outer step) timed apart. One process, so the wire carries nothing: this is the arithmetic a round adds.

    python overhead.py --device cuda --layers 8 --width 512 --steps 60
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from scalesgd.models.gpt import gpt
from scalesgd.models.gpt import GptOptions
from scalesgd.periodic import DiLoCo


def run(codec, args, device):
    torch.manual_seed(0)
    model = gpt(256, GptOptions(layers=args.layers, heads=args.heads, width=args.width, block=args.block))
    model.to(device)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, 256, (args.batch, args.block + 1), device=device)
    diloco = DiLoCo(model, inner, 10, codec=codec) if codec else None
    if diloco:
        diloco.__enter__()
    times, landed = [], []
    for step in range(args.steps):
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256).float(), x[:, 1:].reshape(-1))
        loss.backward()
        inner.step()
        inner.zero_grad(set_to_none=True)
        sync()
        (landed if diloco and (step + 1) % 10 == 0 else times).append(time.perf_counter() - start)
    if diloco:
        diloco.__exit__(None, None, None)
    params = sum(p.numel() for p in model.parameters())
    skip = 5
    return {"codec": codec or "none (AdamW alone)", "params": params,
            "step_ms": 1e3 * statistics.median(times[skip:]),
            "landing_step_ms": 1e3 * statistics.median(landed[1:]) if landed else None,
            "landing_extra_ms": 1e3 * (statistics.median(landed[1:]) - statistics.median(times[skip:]))
            if landed else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    device = torch.device(args.device)
    for codec in (None, "fp32", "fp8", "topk"):
        print(json.dumps(run(codec, args, device)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
