"""`scalesgd bench codec`: throughput of the fp8 kernels, fused (torch.compile) against eager, on the CPU (one
thread by default) or a GPU."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from scalesgd import checks, output
from scalesgd.trace import synchronize
from scalesgd.comm.codecs.fp8 import kernels as fp8
from scalesgd.options import Options, option, words
from scalesgd.options import sizes as element_counts

PATHS = ("compiled", "eager")


@dataclass
class CodecBenchConfig(Options):
    """`scalesgd bench codec`: the fp8 kernels' throughput on one process, each path on the same data."""

    sizes: tuple[int, ...] = option((1 << 20, 1 << 24), "element counts", parse=element_counts,
                                    check=lambda v: None if v and min(v) >= 1 else "give element counts >= 1")
    paths: tuple[str, ...] = option(PATHS, "compiled (torch.compile) and/or eager", choices=PATHS, parse=words,
                                    check=checks.distinct)
    repeats: int = option(5, "timed calls per point", check=checks.positive)
    warmup: int = option(2, "untimed calls first", check=checks.at_least(0))
    threads: int = option(1, "compute threads", check=checks.threads(1))
    device: str = option("cpu", "where the kernels run (auto: the GPU where one is present)",
                         choices=checks.DEVICES, check=checks.device)
    out: str = option("", "output directory", shown_default="runs/bench/codec-<timestamp>", check=checks.output_dir)


# kernel → (what it is, how to call it on prepared inputs); every kernel writes into a kept buffer
KERNELS = {
    "encode": ("x·s → e5m2", lambda k, t: k["encode"](t["bytes"], t["x"], t["s"])),
    "decode": ("e5m2 → x / s", lambda k, t: k["decode"](t["floats"], t["b"], t["s"])),
    "encode_relative": ("g/(|w|+ε)·s → e5m2",
                        lambda k, t: k["encode_relative"](t["bytes"], t["x"], t["w"], t["eps"], t["s"])),
    "decode_relative": ("e5m2 / s·(|w|+ε)",
                        lambda k, t: k["decode_relative"](t["floats"], t["b"], t["w"], t["eps"], t["s"])),
    "clipped_relative": ("|g/(|w|+ε)·s| > 57344",
                         lambda k, t: k["clipped_relative"](t["mask"], t["x"], t["w"], t["eps"], t["s"])),
    "add": ("saturating e5m2 + e5m2", lambda k, t: k["add"](t["sum"], t["c"])),
}
OUTPUT = {"encode": "bytes", "decode": "floats", "encode_relative": "bytes", "decode_relative": "floats",
          "clipped_relative": "mask", "add": "sum"}


def run(cfg: CodecBenchConfig, command: str) -> int:
    """Time every kernel on both paths; GB/s counts the float32 side (4 bytes per element)."""
    torch.set_num_threads(cfg.threads)
    device = checks.resolve_device(cfg.device)
    tables = {mode: fp8.kernel_table(mode) for mode in cfg.paths}
    results = []
    for numel in cfg.sizes:
        inputs = {k: v.to(device) for k, v in _inputs(numel).items()}
        for name in KERNELS:
            for mode, table in tables.items():
                seconds = _time(lambda: KERNELS[name][1](table, inputs), cfg.warmup, cfg.repeats, device)
                results.append({"kernel": name, "path": mode, "numel": numel, "median_s": seconds,
                                "gbps": 4 * numel / seconds / 1e9})
        same = all(_result(name, tables[cfg.paths[0]], inputs).equal(_result(name, t, inputs))
                   for name in KERNELS for t in tables.values())
        for r in results:
            if r["numel"] == numel:
                r["same_as_" + cfg.paths[0]] = same
    report(cfg, results, command)
    return 0


def _inputs(numel: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(numel, generator=g)
    s = torch.rand(numel, generator=g) + 0.5
    return {"x": x, "w": torch.randn(numel, generator=g), "s": s, "eps": torch.tensor(1e-5),
            "b": fp8.encode(x, s), "c": fp8.encode(torch.randn(numel, generator=g), s),
            "bytes": torch.empty(numel, dtype=torch.uint8), "floats": torch.empty(numel),
            "sum": torch.empty(numel, dtype=torch.uint8), "mask": torch.empty(numel, dtype=torch.bool)}


def _result(name: str, table: dict, inputs: dict) -> torch.Tensor:
    """One call's output, from a fresh start (`add` accumulates into its buffer)."""
    inputs["sum"].copy_(inputs["b"])
    KERNELS[name][1](table, inputs)
    return inputs[OUTPUT[name]].clone()


def _time(fn, warmup: int, repeats: int, device: torch.device) -> float:
    """Median seconds of one call, the device's queue drained before and after (a GPU returns before it is done)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(cfg: CodecBenchConfig, results: list[dict], command: str) -> None:
    by = {(r["kernel"], r["numel"], r["path"]): r for r in results}
    columns = ["kernel", "elements", *(f"{p} GB/s" for p in cfg.paths)]
    if len(cfg.paths) == 2:
        columns.append(f"{cfg.paths[0]} ÷ {cfg.paths[1]}")
    rows = []
    for name, (what, _) in KERNELS.items():
        for numel in cfg.sizes:
            speeds = [by[(name, numel, p)]["gbps"] for p in cfg.paths]
            row = [f"{name} ({what})", f"{numel:,}", *(f"{s:.2f}" for s in speeds)]
            if len(speeds) == 2:
                row.append(f"{speeds[0] / speeds[1]:.1f}")
            rows.append(row)
    out = Path(cfg.out)
    where = _where(cfg)
    output.write(out, "codec", {"config": cfg.to_dict(), "kernel_mode_default": fp8.kernel_mode(),
                                "device": where, "results": results}, columns, rows, command)
    plot(out / "codec.png", cfg, results)
    output.console().print(output.rich_table(f"fp8 kernels, {where}, median of {cfg.repeats}", columns, rows))
    output.console().print(f"written to {out}/codec.{{json,md,png}}", highlight=False)


def _where(cfg: CodecBenchConfig) -> str:
    name = checks.device_name(cfg.device)
    return name if name != "CPU" else f"CPU, {cfg.threads} thread(s)"


def plot(path: Path, cfg: CodecBenchConfig, results: list[dict]) -> None:
    plt = output.pyplot()

    numel = max(cfg.sizes)
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(cfg.paths)
    for i, mode in enumerate(cfg.paths):
        speeds = [next(r["gbps"] for r in results if r["kernel"] == k and r["path"] == mode and r["numel"] == numel)
                  for k in KERNELS]
        ax.bar([j + i * width for j in range(len(KERNELS))], speeds, width, label=mode)
    ax.set_xticks([j + width * (len(cfg.paths) - 1) / 2 for j in range(len(KERNELS))], list(KERNELS), rotation=15)
    ax.set_ylabel("GB/s of float32")
    ax.set_title(f"fp8 kernels on {numel:,} elements, {_where(cfg)}")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
