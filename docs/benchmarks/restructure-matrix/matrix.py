"""The short-run matrix a restructure must leave bit-identical: every codec on every engine that takes it, and the
undo, state and option paths around them (fp16's skipped steps, momentum correction, 1-bit Adam, fp8 factors,
accumulation), each a 2-epoch `scalesgd train` on the digits; then `make train`'s default job.

    python docs/benchmarks/restructure-matrix/matrix.py OUT.jsonl [RUN…]   # run the matrix (or those runs) here
    python docs/benchmarks/restructure-matrix/matrix.py --compare A B      # the runs that differ between two

Each line: the run's name, a digest of its final parameters (and buffers), of its per-step losses, the bytes this
rank sent over all steps (our engine's count) and the steps fp16's scaler skipped. Equal digests mean equal bits; the last digits depend on the CPU's kernels, so compare two
outputs made on the same machine."""

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SHORT = ["--workers", "2", "--dataset", "digits", "--model", "resnet8", "--batch-size", "256", "--base-batch", "64",
         "--epochs", "2", "--warmup-epochs", "1", "--compress-after", "2", "--quiet"]
DEFAULT_JOB = ["--workers", "2", "--dataset", "digits", "--model", "resnet8", "--batch-size", "256", "--base-batch",
               "64", "--epochs", "30", "--quiet"]
CODECS = ["fp32", "fp16", "bf16", "powersgd", "fp8", "fp8-direct", "fp8-flat", "lowrank", "lowrank-acp", "onebit",
          "topk", "topk-global", "topk-nodes", "lags"]
DDP_ONLY, NOT_DDP = {"powersgd"}, {"bf16"}  # PyTorch's bf16 hook needs CUDA


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
                fast = ["--base-lr", "0.003" if codec == "onebit" else "3"]  # fp16 overflows at times (1-bit Adam: NaN first)
                out[f"{engine}-{codec}-fp16"] = out[f"{engine}-{codec}"] + ["--precision", "fp16"] + fast
        out[f"{engine}-topk-mc"] = SHORT + ["--engine", engine, "--codec", "topk", "--momentum-correction"]
        out[f"{engine}-topk-adamw-mc"] = SHORT + ["--engine", engine, "--codec", "topk", "--momentum-correction",
                                                  "--optimizer", "adamw", "--base-lr", "0.001"]
        out[f"{engine}-lowrank-fp8"] = SHORT + ["--engine", engine, "--codec", "lowrank", "--factor-wire", "fp8",
                                                "--rank", "2", "--lowrank-min-rate", "1.5"]
        out[f"{engine}-lowrank-acp-fp16-accumulate"] = SHORT + ["--engine", engine, "--codec", "lowrank-acp",
                                                                "--factor-wire", "fp16", "--accumulate", "2"]
    out["make-train"] = DEFAULT_JOB
    return out


def digest(run_dir: Path) -> dict:
    """What the run ended with: its parameters' and losses' digests, and the bytes sent."""
    model = torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]
    params = hashlib.sha256()
    for name in sorted(model):
        params.update(name.encode())
        params.update(model[name].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = hashlib.sha256(json.dumps([line["loss"] for line in lines if line["kind"] == "iter"]).encode())
    iteration = json.loads((run_dir / "summary.json").read_text()).get("iteration", {})
    sent = iteration.get("mean_bytes_sent", 0.0) * iteration.get("iterations", 0)
    skipped = sum(1 for line in lines if line.get("skipped"))
    return {"params": params.hexdigest()[:16], "losses": losses.hexdigest()[:16], "bytes": round(sent),
            "skipped": skipped}


def run_matrix(out: Path, only: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp, out.open("w") as sink:
        for name, options in runs().items():
            if only and name not in only:
                continue
            run_dir = Path(tmp) / name
            done = subprocess.run([sys.executable, "-m", "scalesgd", "train", *options, "--run-dir", str(run_dir)],
                                  capture_output=True, text=True)
            row = {"run": name, **(digest(run_dir) if done.returncode == 0 else
                                   {"error": (done.stderr.strip().splitlines() or ["?"])[-1]})}
            print(json.dumps(row), file=sink, flush=True)
            print(json.dumps(row), flush=True)


def compare(a: Path, b: Path) -> int:
    rows = [{r["run"]: r for r in map(json.loads, p.read_text().splitlines())} for p in (a, b)]
    fields = ("params", "losses", "bytes", "skipped", "error")
    differ = [name for name in rows[0] if name not in rows[1] or any(
        rows[0][name].get(f) != rows[1][name].get(f) for f in fields if f in rows[0][name] and f in rows[1][name])]
    differ += [name for name in rows[1] if name not in rows[0]]
    for name in differ:
        print(f"{name}: {rows[0].get(name)} -> {rows[1].get(name)}")
    print(f"{len(rows[0]) - len(differ)} of {len(rows[0])} runs identical")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    run_matrix(Path(sys.argv[1]), sys.argv[2:])
