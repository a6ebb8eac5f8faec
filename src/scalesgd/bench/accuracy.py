"""`scalesgd bench accuracy`: final test accuracy of training variants over several seeds, resumable."""

from __future__ import annotations

import json
import shlex
import statistics
from pathlib import Path

from scalesgd.bench import output
from scalesgd.config import AccuracyBenchConfig
from scalesgd.train.runs import failed, slug, train_once


def run(cfg: AccuracyBenchConfig, command: str) -> int:
    """Train every variant × seed in turn (finished runs are kept, interrupted ones resumed)."""
    out = Path(cfg.out)
    results = []
    for variant in cfg.variants:
        for seed in cfg.seeds:
            run_dir = out / "runs" / f"{slug(variant)}-seed{seed}"
            code = train_once([*cfg.train_args, *shlex.split(variant), "--seed", str(seed)], run_dir,
                              f"{variant} · seed {seed}")
            if code != 0:
                return failed(f"`{variant}` seed {seed}", code, run_dir)
            summary = json.loads((run_dir / "summary.json").read_text())
            results.append({"variant": variant, "seed": seed, "final_test_acc": summary["final_test_acc"],
                            "wall_time_s": summary["wall_time_s"], "run_dir": str(run_dir),
                            "bytes_sent_per_iter": summary.get("iteration", {}).get("mean_bytes_sent")})
    report(cfg, results, command)
    return 0


def report(cfg: AccuracyBenchConfig, results: list[dict], command: str) -> None:
    """Per variant: every seed's accuracy, the median, and the median's distance to the first variant."""
    from rich.console import Console

    medians = {v: statistics.median(r["final_test_acc"] for r in results if r["variant"] == v) for v in cfg.variants}
    reference = medians[cfg.variants[0]]
    columns = ["variant", *(f"seed {s} %" for s in cfg.seeds), "median %", f"points vs `{cfg.variants[0]}`"]
    rows = []
    for v in cfg.variants:
        accs = [r["final_test_acc"] for r in results if r["variant"] == v]
        rows.append([f"`{v}`", *(f"{100 * a:.2f}" for a in accs), f"{100 * medians[v]:.2f}",
                     f"{100 * (medians[v] - reference):+.2f}"])
    out = Path(cfg.out)
    output.write(out, "accuracy", {"config": cfg.to_dict(), "medians": medians, "results": results},
                 columns, rows, command)
    plot(out / "accuracy.png", cfg, results, medians)
    Console().print(output.rich_table(f"final test accuracy, {len(cfg.seeds)} seeds", columns, rows))
    Console().print(f"written to {out}/accuracy.{{json,md,png}}", highlight=False)


def plot(path: Path, cfg: AccuracyBenchConfig, results: list[dict], medians: dict) -> None:
    plt = output.pyplot()

    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(cfg.variants)), 4))
    for i, v in enumerate(cfg.variants):
        accs = [100 * r["final_test_acc"] for r in results if r["variant"] == v]
        ax.scatter([i] * len(accs), accs, color="grey", s=18, zorder=3)
        ax.bar(i, 100 * medians[v], width=0.6, alpha=0.6)
    ax.set_xticks(range(len(cfg.variants)), cfg.variants, rotation=15, fontsize=8)
    ax.set_ylabel("final test accuracy (%)")
    low = min(100 * r["final_test_acc"] for r in results)
    ax.set_ylim(max(0, low - 5), 100)
    ax.set_title(f"median of {len(cfg.seeds)} seeds (dots: each seed)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
