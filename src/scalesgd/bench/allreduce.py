"""`scalesgd bench allreduce`: time and bus bandwidth of each allreduce algorithm against size."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from scalesgd import checks, output
from scalesgd.bench.launch import BenchLaunch
from scalesgd.comm.codecs import CODECS, Channel, make_codec
from scalesgd.comm.engine.driver import BucketDriver
from scalesgd.comm.wire.collectives import ALGORITHMS, allreduce
from scalesgd.errors import UsageError
from scalesgd.options import option, words
from scalesgd.options import sizes as element_counts
from scalesgd.runtime import process_group

DTYPES = ("float32", "float16", "bfloat16", "float64")
COPIES = 3  # buffers of a size each worker holds: the input, its working clone, an algorithm's receive buffer


def exchanges() -> list[str]:
    """What the bench times: every allreduce algorithm, then every dense codec (its encode + sum + decode)."""
    return [*ALGORITHMS, *(name for name, entry in CODECS.items() if entry.build is not None and not entry.sparse)]


@dataclass
class AllreduceBenchConfig(BenchLaunch):
    """`scalesgd bench allreduce`: sizes in elements, every algorithm timed on the same tensors."""

    workers: int = option(4, "local workers; under torchrun the launch decides", check=checks.local_workers)
    sizes: tuple[int, ...] = option((256, 4096, 16384, 65536, 262144, 1 << 20, 1 << 22),
                                    "element counts, e.g. 256,4K,64K,1M,16M (K = 1024)", parse=element_counts,
                                    check=lambda v: None if v and min(v) >= 0 else "give element counts >= 0")
    algorithms: tuple[str, ...] = option(("ring", "halving_doubling", "native"), "comma-separated; codecs time "
                                         "encode + sum + decode", choices=exchanges, parse=words,
                                         check=checks.distinct)
    repeats: int = option(10, "timed repetitions per point", check=checks.positive)
    warmup: int = option(3, "untimed repetitions first", check=checks.at_least(0))
    dtype: str = option("float32", "element type", choices=DTYPES)

    def validate(self) -> AllreduceBenchConfig:
        super().validate()
        self.check_launch(self.workers)
        largest = max(self.sizes)
        self.check_memory(self.workers, "sizes", largest * COPIES * torch.finfo(getattr(torch, self.dtype)).bits // 8,
                          f"{COPIES} buffers of {largest:,} {self.dtype} elements", "give smaller sizes or fewer "
                          "`workers`")
        compressed = [a for a in self.algorithms if a in CODECS]
        if compressed and self.dtype != "float32":
            raise UsageError(f"`algorithms` {','.join(compressed)} compress float32 gradients; use `dtype` float32")
        return self

    @property
    def needs_topology(self) -> bool:
        return any(ALGORITHMS[a].needs_topology if a in ALGORITHMS else CODECS[a].needs_topology
                   for a in self.algorithms)


def _codec_exchange(work: torch.Tensor, env, codecs: dict, name: str) -> int:
    """A codec's whole exchange (encode → sum → decode) for a bucket of weights all 1.

    fp16 is PyTorch's fp16_compress_hook arithmetic over gloo's own allreduce; fp8 estimates its
    range on the first (warm-up) call and then every 100 calls, as in training.
    """
    n = work.numel()
    if (name, n) not in codecs:
        weights = torch.ones(n, device=work.device)
        driver = BucketDriver(make_codec(name), Channel(dist.group.WORLD, env.world_size, "native",
                                                        env.topology_groups))
        codecs[(name, n)] = (driver, driver.view(0, [weights], [0], n))
    driver, view = codecs[(name, n)]
    return driver.exchange(work, view)


def compressed_exchanges(names) -> dict:
    """The codecs among `names`, timed beside the algorithms: fp32 in, the mean over ranks out."""
    codecs: dict = {}
    return {name: (lambda w, env, name=name: _codec_exchange(w, env, codecs, name)) for name in names
            if name in CODECS}


def run(cfg: AllreduceBenchConfig, command: str) -> int:
    """Measure on this rank (all ranks take part); rank 0 writes the results."""
    env = process_group.init(cfg.timeout, cfg.threads,
                             procs_per_node=cfg.node_size(cfg.workers) if cfg.needs_topology else None)
    try:
        exchanges = compressed_exchanges(cfg.algorithms)
        results = [r for n in cfg.sizes for r in measure_size(cfg, env, n, exchanges)]
        if env.is_main:
            report(cfg, env.world_size, results, command)
        process_group.finish()
        return 0 if all(r["correct"] for r in results) else 1
    finally:
        process_group.close()


def measure_size(cfg: AllreduceBenchConfig, env, numel: int, exchanges: dict) -> list[dict]:
    """Each algorithm on `numel` elements, taking turns every repetition so drift hits all alike.

    A point's time is the median over repetitions of the slowest rank's time (after a barrier).
    """
    dtype = getattr(torch, cfg.dtype)
    base = torch.full((numel,), float(env.rank + 1), dtype=dtype, device=env.device)
    expected = env.world_size * (env.world_size + 1) / 2
    times = {a: [] for a in cfg.algorithms}
    correct = {a: True for a in cfg.algorithms}
    sent = {}
    for i in range(cfg.warmup + cfg.repeats):
        for algorithm in cfg.algorithms:
            work = base.clone()
            dist.barrier()
            start = time.perf_counter()
            if algorithm in exchanges:
                sent[algorithm] = exchanges[algorithm](work, env)
            else:
                sent[algorithm] = allreduce(work, algorithm, topology=env.topology_groups)
            elapsed = time.perf_counter() - start
            if algorithm in exchanges:
                work.mul_(env.world_size)  # compare the mean with the sum, as for the others
            if i >= cfg.warmup:
                times[algorithm].append(elapsed)
            tolerance = 2.0 ** -3 * expected if algorithm in exchanges else 0.0  # a few roundings
            correct[algorithm] &= bool(numel == 0 or torch.all((work - expected).abs() <= tolerance))
    slowest = torch.tensor([times[a] for a in cfg.algorithms], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    flags = torch.tensor([0.0 if correct[a] else 1.0 for a in cfg.algorithms])
    dist.all_reduce(flags)
    nbytes, p = numel * base.element_size(), env.world_size
    results = []
    native = slowest[cfg.algorithms.index("native")] if "native" in cfg.algorithms else None
    for row, algorithm in enumerate(cfg.algorithms):
        mine = slowest[row].tolist()
        seconds = statistics.median(mine)
        result = {"algorithm": algorithm, "numel": numel, "bytes": nbytes, "median_s": seconds,
                  "min_s": min(mine), "max_s": max(mine),
                  "bus_gbps": 2 * (p - 1) / p * nbytes / seconds / 1e9 if seconds > 0 else 0.0,
                  "bytes_sent": sent[algorithm], "correct": flags[row].item() == 0}
        if native is not None and min(mine) > 0:  # per repetition (they take turns): the speed-up's spread
            ratios = (native / slowest[row]).tolist()
            result["speedup"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        results.append(result)
    return results


def report(cfg: AllreduceBenchConfig, world: int, results: list[dict], command: str) -> None:
    """Table with each algorithm's time and its ratio to `native`, JSON, Markdown and the PNG."""
    native = {r["numel"]: r["median_s"] for r in results if r["algorithm"] == "native"}
    columns = ["elements", "bytes", "algorithm", "median ms", "min–max ms", "bus GB/s", "× native",
               "native ÷ this (min–max)", "correct"]
    rows = [[f"{r['numel']:,}", _human(r["bytes"]), r["algorithm"], f"{1e3 * r['median_s']:.3f}",
             f"{1e3 * r['min_s']:.1f}–{1e3 * r['max_s']:.1f}", f"{r['bus_gbps']:.3f}",
             f"{r['median_s'] / native[r['numel']]:.2f}" if r["numel"] in native else "",
             (f"{r['speedup']['median']:.2f} ({r['speedup']['min']:.2f}–{r['speedup']['max']:.2f})"
              if "speedup" in r else ""), "yes" if r["correct"] else "NO"] for r in results]
    out = Path(cfg.out)
    output.write(out, "allreduce", {"world_size": world, "config": cfg.to_dict(), "results": results},
                 columns, rows, command)
    plot(out / "allreduce.png", world, results)
    output.console().print(output.rich_table(f"allreduce, {world} workers, median of {cfg.repeats}", columns, rows))
    output.console().print(f"written to {out}/allreduce.{{json,md,png}}", highlight=False)


def plot(path: Path, world: int, results: list[dict]) -> None:
    plt = output.pyplot()

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for algorithm in dict.fromkeys(r["algorithm"] for r in results):
        mine = [r for r in results if r["algorithm"] == algorithm and r["bytes"] > 0]
        ax_t.plot([r["bytes"] for r in mine], [1e3 * r["median_s"] for r in mine], "o-", label=algorithm)
        ax_b.plot([r["bytes"] for r in mine], [r["bus_gbps"] for r in mine], "o-", label=algorithm)
    for ax, label in ((ax_t, "time (ms)"), (ax_b, "bus bandwidth (GB/s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    ax_t.set_yscale("log")
    fig.suptitle(f"allreduce, {world} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _human(nbytes: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"
