"""`scalesgd bench accuracy`: final test accuracy (a language model's: validation loss) of training variants over
several seeds, resumable."""

from __future__ import annotations

import json
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

from scalesgd import checks, output
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError, option_name
from scalesgd.options import Options, ints, option
from scalesgd.train.rundir import SUMMARY_NAME
from scalesgd.train.study import failed, slug, train_once

SETS = ("seed", "run_dir", "resume")  # train options the bench sets for every run


@dataclass
class AccuracyBenchConfig(Options):
    """`scalesgd bench accuracy`: `scalesgd train` with shared options, per variant and seed."""

    variants: tuple[str, ...] = option(("--codec fp32",), "';'-separated train options per variant, e.g. "
                                       "'--codec fp32;--codec fp8' (the first is the reference)",
                                       parse=lambda t: tuple(v.strip() for v in t.split(";") if v.strip()),
                                       shown_default="--codec fp32",
                                       check=lambda v: None if v else "give at least one, e.g. '--codec fp32'")
    seeds: tuple[int, ...] = option((0, 1, 2), "each variant trains once per seed", parse=ints,
                                    check=checks.all_of(checks.distinct, checks.each(checks.seed)))
    out: str = option("", "output directory", shown_default="runs/bench/accuracy-<timestamp>",
                      check=checks.output_dir)
    train_args: tuple[str, ...] = option((), "-- then options for every run", remainder=True)

    def validate(self) -> AccuracyBenchConfig:
        """Every option, then every variant as the train options it runs with, before any run starts."""
        super().validate()
        for variant in self.variants:
            try:
                argv = [*self.train_args, *shlex.split(variant)]
            except ValueError as err:
                raise UsageError(f"`variants` {variant!r}: {err}") from None
            owned = [f"`{name}`" for name in SETS if option_name(name) in argv]
            if owned:
                raise UsageError(f"{', '.join(owned)} in {variant!r}: the bench sets it per run")
            TrainConfig.from_argv(argv)
        return self


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
            summary = json.loads((run_dir / SUMMARY_NAME).read_text())
            results.append({"variant": variant, "seed": seed, "final_test_acc": summary["final_test_acc"],
                            **{key: summary[key] for key in ("final_test_loss", "final_test_perplexity")
                               if key in summary},
                            "wall_time_s": summary["wall_time_s"], "run_dir": str(run_dir),
                            "bytes_sent_per_iter": summary.get("iteration", {}).get("mean_bytes_sent")})
    report(cfg, results, command)
    return 0


@dataclass(frozen=True)
class Metric:
    """What the bench compares: test accuracy in % (higher is better, points apart), or a language model's
    validation loss in nats per token (lower is better, per cent apart)."""

    key: str
    title: str
    scale: float

    @classmethod
    def of(cls, results: list[dict]) -> Metric:
        if all("final_test_perplexity" in r for r in results):
            return cls("final_test_loss", "final validation loss (nats/token)", 1.0)
        return cls("final_test_acc", "final test accuracy (%)", 100.0)

    def shown(self, value: float) -> str:
        return f"{self.scale * value:.2f}" if self.scale != 1 else f"{value:.4f}"

    def apart(self, value: float, reference: float, signed: bool = True):
        """How far `value` is from the reference's: points of accuracy, or per cent of the loss (as text, or the
        number where not `signed`)."""
        distance = self.scale * (value - reference) if self.scale != 1 else 100 * (value - reference) / reference
        if not signed:
            return distance
        return f"{distance:+.2f}" + (" %" if self.scale == 1 else "")


def report(cfg: AccuracyBenchConfig, results: list[dict], command: str) -> None:
    """Per variant: every seed's accuracy (or validation loss), the median, the median's distance to the first
    variant's, and the distances seed by seed (the same seed starts from the same weights and sees the same data,
    so a codec's effect shows apart from the spread between runs)."""
    metric = Metric.of(results)
    medians = {v: statistics.median(r[metric.key] for r in results if r["variant"] == v) for v in cfg.variants}
    reference = medians[cfg.variants[0]]
    unit = " %" if metric.scale != 1 else ""
    apart = "points" if metric.scale != 1 else "per cent"
    columns = ["variant", *(f"seed {s}{unit}" for s in cfg.seeds), f"median{unit}",
               f"{apart} vs `{cfg.variants[0]}`", f"{apart} vs it, seed by seed: median (min–max)"]
    rows = []
    by_seed = {(r["variant"], r["seed"]): r[metric.key] for r in results}
    for v in cfg.variants:
        values = [r[metric.key] for r in results if r["variant"] == v]
        paired = sorted(metric.apart(by_seed[v, s], by_seed[cfg.variants[0], s], signed=False) for s in cfg.seeds)
        rows.append([f"`{v}`", *(metric.shown(a) for a in values), metric.shown(medians[v]),
                     metric.apart(medians[v], reference),
                     f"{statistics.median(paired):+.2f} ({paired[0]:+.2f} – {paired[-1]:+.2f})"])
    out = Path(cfg.out)
    output.write(out, "accuracy", {"config": cfg.to_dict(), "metric": metric.key, "medians": medians,
                                   "results": results}, columns, rows, command)
    plot(out / "accuracy.png", cfg, results, medians, metric)
    output.console().print(output.rich_table(f"{metric.title}, {len(cfg.seeds)} seeds", columns, rows))
    output.console().print(f"written to {out}/accuracy.{{json,md,png}}", highlight=False)


def plot(path: Path, cfg: AccuracyBenchConfig, results: list[dict], medians: dict, metric: Metric) -> None:
    plt = output.pyplot()

    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(cfg.variants)), 4))
    for i, v in enumerate(cfg.variants):
        values = [metric.scale * r[metric.key] for r in results if r["variant"] == v]
        ax.scatter([i] * len(values), values, color="grey", s=18, zorder=3)
        ax.bar(i, metric.scale * medians[v], width=0.6, alpha=0.6)
    ax.set_xticks(range(len(cfg.variants)), cfg.variants, rotation=15, fontsize=8)
    ax.set_ylabel(metric.title)
    every = [metric.scale * r[metric.key] for r in results]
    if metric.scale != 1:
        ax.set_ylim(max(0, min(every) - 5), 100)
    else:  # losses: the spread between variants is what matters
        pad = max(0.05 * (max(every) - min(every)), 1e-3)
        ax.set_ylim(min(every) - 10 * pad, max(every) + 2 * pad)
    ax.set_title(f"median of {len(cfg.seeds)} seeds (dots: each seed)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
