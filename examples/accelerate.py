"""scalesgd's top-k exchange in a Hugging Face Accelerate script: `prepare` wraps the model in DDP, then the hook is
registered on it; residuals stay on each worker and only (index, value) pairs travel.

    torchrun --nproc-per-node 2 examples/accelerate.py     # Accelerate reads the launch from torchrun
"""

import argparse
import json
import sys
from pathlib import Path

# This file is named after the package it shows: keep its folder off the import path, or `import accelerate` finds it.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402 (after the path fix above)
from accelerate import Accelerator  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from scalesgd import CodecHookState, codec_hook  # noqa: E402
from scalesgd.comm.codecs import CodecSettings, TopkOptions  # noqa: E402


def teacher_task(samples=4096, features=32, classes=10):
    """Inputs labelled by a fixed random linear teacher: a task a small MLP learns in a few epochs."""
    g = torch.Generator().manual_seed(0)
    x, teacher = torch.randn(samples, features, generator=g), torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--codec", default="topk", help="any scalesgd codec: fp16, bf16, fp8, topk, lags, …")
    parser.add_argument("--density", type=float, default=0.05, help="top-k: the fraction of entries sent")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    loader = DataLoader(teacher_task(), batch_size=128, shuffle=True, drop_last=True)
    ddp, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # the loader is split among workers
    # a short demo: compress from the first step (a real run keeps the defaults: dense start, density warm-up)
    state = CodecHookState(args.codec, settings=CodecSettings(TopkOptions(density=args.density, density_warmup=0)),
                           compress_after=0, model=model)
    ddp.register_comm_hook(state, codec_hook)  # after `prepare`: `ddp` is DistributedDataParallel
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    losses, steps = [], 0
    for _ in range(args.epochs):
        total = torch.zeros(2)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            accelerator.backward(loss)
            optimizer.step()
            total += torch.stack([loss.detach(), torch.tensor(1.0)])
            steps += 1
        total = accelerator.reduce(total, reduction="sum")
        losses.append(round(float(total[0] / total[1]), 4))
    counters = state.counters()
    if accelerator.is_main_process:
        print(json.dumps({"losses": losses, "codec": args.codec, "world": accelerator.num_processes, "steps": steps,
                          "parameters": sum(p.numel() for p in model.parameters()),
                          "bytes_per_step": state.bytes_sent / steps, "counters": counters}))
    state.close()
    accelerator.end_training()


if __name__ == "__main__":
    main()
