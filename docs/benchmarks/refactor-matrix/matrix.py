"""The short-run matrix a restructure must leave bit-identical: every codec on every engine that takes it, the undo,
state and option paths around them (fp16's skipped steps, momentum correction, 1-bit Adam, fp8 factors,
accumulation), periodic runs through every codec with fragments, overlap and mixing, sharded runs (ours and FSDP2's,
over every rank and within nodes, with DiLoCo across nodes), and `make train`'s job.

    python docs/benchmarks/refactor-matrix/matrix.py OUT.jsonl [--keep DIR] [RUN…]   # run the matrix (or those runs)
    python docs/benchmarks/refactor-matrix/matrix.py --compare A B                   # the runs that differ
    python docs/benchmarks/refactor-matrix/matrix.py --resume DIR OUT.jsonl [RUN…]   # resume kept runs 1 epoch on

Each line: the run's name, a digest of its final parameters (and buffers), of its per-step losses, the bytes this
rank sent over all steps and the steps fp16's scaler skipped. Equal digests mean equal bits; the last digits depend on
the CPU's kernels, so compare two outputs made on the same machine."""

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

DIGITS = ["--workers", "2", "--dataset", "digits", "--model", "resnet8", "--batch-size", "256", "--base-batch", "64",
          "--epochs", "2", "--warmup-epochs", "1", "--quiet"]
SHORT = DIGITS + ["--compress-after", "2"]
GPT = ["--workers", "2", "--model", "gpt", "--dataset", "text", "--samples", "512", "--epochs", "1", "--quiet"]
DEFAULT_JOB = ["--workers", "2", "--dataset", "digits", "--model", "resnet8", "--batch-size", "256", "--base-batch",
               "64", "--epochs", "30", "--quiet"]
CODECS = ["fp32", "fp16", "bf16", "powersgd", "fp8", "fp8-direct", "fp8-flat", "lowrank", "lowrank-acp", "onebit",
          "topk", "topk-global", "topk-nodes", "lags"]
DDP_ONLY, NOT_DDP = {"powersgd"}, {"bf16"}  # PyTorch's bf16 hook needs CUDA
SHARDED_CODECS = ["fp32", "bf16", "fp8", "topk", "lowrank"]


def runs() -> dict[str, list[str]]:
    """Name → the options after `scalesgd train`."""
    out = {}
    for engine in ("scalesgd", "ddp"):
        for codec in CODECS:
            if (engine == "scalesgd" and codec in DDP_ONLY) or (engine == "ddp" and codec in NOT_DDP):
                continue
            extra = ["--optimizer", "onebit-adam", "--base-lr", "0.001"] if codec == "onebit" else []
            out[f"{engine}-{codec}"] = SHORT + ["--engine", engine, "--codec", codec] + extra
            if codec in ("fp8", "topk", "lowrank", "lowrank-acp", "onebit"):  # the undo of a step fp16 skips: a rate
                # at which fp16 overflows at times (1-bit Adam: NaN first)
                fast = ["--base-lr", "0.003" if codec == "onebit" else "3"]
                out[f"{engine}-{codec}-fp16"] = out[f"{engine}-{codec}"] + ["--precision", "fp16"] + fast
        out[f"{engine}-topk-mc"] = SHORT + ["--engine", engine, "--codec", "topk", "--momentum-correction"]
        out[f"{engine}-topk-adamw-mc"] = SHORT + ["--engine", engine, "--codec", "topk", "--momentum-correction",
                                                  "--optimizer", "adamw", "--base-lr", "0.001"]
        out[f"{engine}-lowrank-fp8"] = SHORT + ["--engine", engine, "--codec", "lowrank", "--factor-wire", "fp8",
                                                "--rank", "2", "--lowrank-min-rate", "1.5"]
        out[f"{engine}-lowrank-acp-fp16-accumulate"] = SHORT + ["--engine", engine, "--codec", "lowrank-acp",
                                                                "--factor-wire", "fp16", "--accumulate", "2"]
    for codec in CODECS:  # periodic synchronisation through every codec of ours
        if codec in DDP_ONLY:
            continue
        extra = ["--onebit-beta1", "0"] if codec == "onebit" else []
        out[f"periodic-{codec}"] = DIGITS + ["--local-steps", "4", "--codec", codec] + extra
    out["periodic-fp8-streaming"] = DIGITS + ["--local-steps", "4", "--fragments", "2", "--overlap-steps", "1",
                                              "--mix", "0.3", "--codec", "fp8"]
    out["periodic-topk-streaming"] = DIGITS + ["--local-steps", "4", "--fragments", "4", "--codec", "topk",
                                               "--density", "0.05"]
    out["periodic-fp16-precision"] = DIGITS + ["--local-steps", "2", "--precision", "fp16", "--base-lr", "3",
                                               "--accumulate", "2"]
    out["periodic-outer-average"] = DIGITS + ["--local-steps", "3", "--outer-lr", "1", "--outer-momentum", "0"]
    out["gpt-scalesgd-fp8"] = GPT + ["--engine", "scalesgd", "--codec", "fp8"]
    out["gpt-periodic-fp8"] = GPT + ["--local-steps", "2", "--fragments", "2", "--overlap-steps", "0", "--codec", "fp8"]
    for codec in SHARDED_CODECS:
        out[f"gpt-fsdp-{codec}"] = GPT + ["--engine", "fsdp", "--codec", codec]
    out["gpt-fsdp-bf16-precision"] = GPT + ["--engine", "fsdp", "--codec", "fp32", "--precision", "bf16"]
    out["gpt-fsdp-onebit"] = GPT + ["--engine", "fsdp", "--codec", "onebit", "--optimizer", "onebit-adam",
                                    "--compress-after", "3"]
    out["gpt-fsdp-accumulate"] = GPT + ["--engine", "fsdp", "--codec", "fp8", "--accumulate", "2"]
    out["gpt-fsdp2-fp32"] = GPT + ["--engine", "fsdp2", "--codec", "fp32"]
    out["gpt-fsdp2-bf16"] = GPT + ["--engine", "fsdp2", "--codec", "bf16"]
    node = ["--workers", "4", "--procs-per-node", "2", "--engine", "fsdp", "--shard", "node"]
    for codec in ("fp32", "fp8", "topk"):
        out[f"gpt-fsdp-node-{codec}"] = GPT + node + ["--codec", codec]
    out["gpt-fsdp-node-periodic-fp8"] = GPT + node + ["--codec", "fp8", "--local-steps", "2"]
    out["gpt-fsdp2-node"] = GPT + ["--workers", "4", "--procs-per-node", "2", "--engine", "fsdp2", "--shard", "node"]
    out["make-train"] = DEFAULT_JOB
    return out


def digest(run_dir: Path) -> dict:
    """What the run ended with: its parameters' and losses' digests, and the bytes sent."""
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    model = saved["model"]
    if model is None:  # a sharded run's parameters are in its shards' folder
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(run_dir / saved["shards"], Path(tmp) / "whole.pt")
            model = torch.load(Path(tmp) / "whole.pt", weights_only=False)["model"]
    params = hashlib.sha256()
    for name in sorted(model):
        params.update(name.encode())
        params.update(model[name].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = hashlib.sha256(json.dumps([line["loss"] for line in lines if line["kind"] == "iter"]).encode())
    summary = json.loads((run_dir / "summary.json").read_text())
    skipped = sum(1 for line in lines if line.get("skipped"))
    return {"params": params.hexdigest()[:16], "losses": losses.hexdigest()[:16],
            "bytes": summary.get("bytes_sent"), "skipped": skipped}


def train(options: list[str], run_dir: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "scalesgd", "train", *options], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return digest(run_dir)


def run_matrix(out: Path, only: list[str], keep: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp, out.open("w") as sink:
        for name, options in runs().items():
            if only and name not in only:
                continue
            run_dir = Path(tmp) / name
            row = {"run": name, **train([*options, "--run-dir", str(run_dir)], run_dir)}
            if keep is not None and run_dir.exists():
                shutil.copytree(run_dir, keep / name, dirs_exist_ok=True)
            print(json.dumps(row), file=sink, flush=True)
            print(json.dumps(row), flush=True)


def resume_kept(kept: Path, out: Path, only: list[str]) -> None:
    """Each kept run (a copy; or those named) resumed for one more epoch: it must load and train on."""
    with tempfile.TemporaryDirectory() as tmp, out.open("w") as sink:
        for source in sorted(p for p in kept.iterdir() if p.is_dir() and (not only or p.name in only)):
            run_dir = Path(tmp) / source.name
            shutil.copytree(source, run_dir)
            epochs = json.loads((run_dir / "config.json").read_text())["epochs"] + 1
            row = {"run": source.name, **train(["--resume", str(run_dir), "--epochs", str(epochs)], run_dir)}
            print(json.dumps(row), file=sink, flush=True)
            print(json.dumps(row), flush=True)


def compare(a: Path, b: Path) -> int:
    rows = [{r["run"]: r for r in map(json.loads, p.read_text().splitlines())} for p in (a, b)]
    fields = ("params", "losses", "bytes", "skipped", "error")
    differ = [name for name in rows[0] if name not in rows[1] or any(
        rows[0][name].get(f) != rows[1][name].get(f) for f in fields if f in rows[0][name] or f in rows[1][name])]
    differ += [name for name in rows[1] if name not in rows[0]]
    for name in differ:
        print(f"{name}: {rows[0].get(name)} -> {rows[1].get(name)}")
    print(f"{len(rows[0]) - len(differ)} of {len(rows[0])} runs identical")
    return 1 if differ else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--compare"]:
        sys.exit(compare(Path(args[1]), Path(args[2])))
    if args[:1] == ["--resume"]:
        resume_kept(Path(args[1]), Path(args[2]), args[3:])
        sys.exit(0)
    keep = None
    if "--keep" in args:
        at = args.index("--keep")
        keep = Path(args[at + 1])
        keep.mkdir(parents=True, exist_ok=True)
        del args[at:at + 2]
    run_matrix(Path(args[0]), args[1:], keep)
