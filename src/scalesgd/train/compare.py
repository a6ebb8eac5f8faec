"""`scalesgd compare`: several runs' curves in one figure and their numbers in one table (fp32 against fp8 or top-k).

A RUN_DIR is a `scalesgd train` run directory (config.json and metrics.jsonl), finished (summary.json) or cut
short. A directory that is not one but holds run directories, directly or in runs/ (where `scalesgd sweep` and
`scalesgd bench accuracy` put theirs), stands for every run in it, in name order.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from scalesgd import output
from scalesgd.comm.codecs import CODECS
from scalesgd.comm.engine.exchange import parse_exchange
from scalesgd.checks import output_dir
from scalesgd.errors import UsageError
from scalesgd.options import Options, option
from scalesgd.train.auto import AUTO_NAME
from scalesgd.train.objective import throughput
from scalesgd.train.report import Curves, periodic_text, read_curves, read_json, run_config
from scalesgd.train.rundir import CONFIG_NAME, METRICS_NAME, SUMMARY_NAME

PNG_NAME = "compare.png"
MD_NAME = "compare.md"
STUDY_RUNS = "runs"  # `scalesgd sweep` and `bench accuracy` train into OUT/runs/NAME
EXPECTED = "expected a `scalesgd train` run directory or a directory of them"
MISSING = "—"
AMOUNT_SYMBOLS = {"density": "ρ"}  # how a codec's amount is written in a legend (others by their option's name)
DASHES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (5, 2, 1, 2)))  # a run drawn over an identical one still shows


@dataclass
class Compared:
    """One run as compared: where it is, what it trained, its summary (empty when cut short) and its curves."""

    path: Path
    config: dict
    summary: dict
    curves: Curves


def is_run_dir(path: Path) -> bool:
    """A directory `scalesgd train` wrote: the two files every run has from its first step on."""
    return (path / CONFIG_NAME).is_file() and (path / METRICS_NAME).is_file()


def _natural(path: Path) -> list:
    """Name order with numbers by value: b64 before b128, density_0.001 before density_0.01, seed2 before seed10."""
    return [float(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+(?:\.\d+)?)", path.name))]


def expand(paths: list[str]) -> list[Path]:
    """The run directories the arguments name, each once: a run directory itself, any other the runs inside it."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise UsageError(f"{path} does not exist; {EXPECTED}")
        if not path.is_dir():
            raise UsageError(f"{path} is not a directory; {EXPECTED}")
        if is_run_dir(path):
            found.append(path)
            continue
        inside = [child for base in (path, path / STUDY_RUNS) if base.is_dir()
                  for child in sorted(base.iterdir(), key=_natural) if child.is_dir() and is_run_dir(child)]
        if not inside:
            lacks = " and ".join(name for name in (CONFIG_NAME, METRICS_NAME) if not (path / name).is_file())
            raise UsageError(f"{path} is not a run directory (no {lacks}) and holds none, directly or in "
                             f"{STUDY_RUNS}/")
        found += inside
    unique = {p.resolve(): p for p in reversed(found)}  # the first mention of each run keeps its place
    return [p for p in found if unique[p.resolve()] is p]


def load(path: Path) -> Compared:
    """A run's config (as it trained: --exchange auto's choice included), summary and curves."""
    return Compared(path, run_config(path), read_json(path / SUMMARY_NAME), read_curves(path))


def exchange(run: Compared) -> str:
    """What travelled between workers (engine, codec, the amount its registration names: a sparse codec's density, a
    low-rank one's rank), as a reader tells runs apart."""
    cfg = run.config
    codec = cfg.get("codec", "fp32")
    if cfg.get("exchange") == "auto":
        codec = "auto → " + ((run.summary.get("auto") or read_json(run.path / AUTO_NAME)).get("codec") or "undecided")
    text = (f"periodic {codec}, {periodic_text(cfg)}" if cfg.get("local_steps")
            else f"{cfg.get('engine', 'ddp')} {codec}")
    chosen = parse_exchange(codec.split()[-1])[1]
    amount = CODECS[chosen].amount if chosen in CODECS else None
    if amount is not None and amount in cfg:
        text += f" {AMOUNT_SYMBOLS.get(amount, amount)}={cfg[amount]:g}"
    return text


def labels(runs: list[Compared]) -> list[str]:
    """Each run's legend (model · exchange · global batch), with its directory where two would read the same."""
    base = [f"{r.config.get('model', '?')} · {exchange(r)} · batch {r.config.get('batch_size', '?')}" for r in runs]
    for suffix in (lambda r: r.path.name, lambda r: str(r.path)):  # the directory's name, else its whole path
        names = [f"{name} ({suffix(r)})" if base.count(name) > 1 else name for name, r in zip(base, runs)]
        if len(set(names)) == len(names):
            break
    return names


def wall_clock(run: Compared) -> list[float] | None:
    """Seconds from the run's start to each iteration's end, None when no epoch finished (no speed was measured).

    The log times epochs, not iterations: each iteration of an epoch takes global batch ÷ that epoch's images/s
    (an unfinished epoch the last finished one's), and a finished run's times are stretched to end at its
    summary's wall time, so start-up and evaluation are shared out in proportion.
    """
    text = any("tokens_per_s" in e for e in run.curves.epochs)  # a language model's: tokens per second
    batch = run.config.get("batch_size", 0) * (run.config.get("gpt_block", 1) if text else 1)
    per_iter = {e["epoch"]: batch / throughput(e)[0] for e in run.curves.epochs if throughput(e)[0]}
    if not per_iter or not run.curves.iters:
        return None
    last, t, times = per_iter[max(per_iter)], 0.0, []
    for record in run.curves.iters:
        t += per_iter.get(record["epoch"], last)
        times.append(t)
    total = run.summary.get("wall_time_s")
    return [x * total / times[-1] for x in times] if total and times[-1] > 0 else times


def _mean_counter(run: Compared, name: str) -> float | None:
    """The run's mean of a codec counter: the summary's, or over the logged iterations of a run cut short."""
    recorded = run.summary.get("iteration", {}).get(f"mean_{name}")
    if recorded is not None:
        return recorded
    values = [r[name] for r in run.curves.iters if name in r]
    return statistics.fmean(values) if values else None


def table(runs: list[Compared]) -> tuple[list[str], list[list]]:
    """One row per run: what it trained, how well and how fast, what it sent, and its codec's guardrail counters."""
    counters = sorted({name for r in runs for name in r.curves.counters})
    text = [any("test_perplexity" in e for e in r.curves.epochs) for r in runs]  # language models
    quality = ([("final test acc %", lambda e: f"{100 * e['test_acc']:.2f}")] if not all(text) else []) + (
        [("final val loss", lambda e: f"{e['test_loss']:.4f}"),
         ("perplexity", lambda e: f"{e['test_perplexity']:.3f}" if "test_perplexity" in e else MISSING)]
        if any(text) else [])
    columns = ["run", "model", "codec", "global batch", "workers", *(name for name, _ in quality), "wall time s",
               "throughput /s", "sent MB/iter", *(f"mean {name}" for name in counters)]
    rows = []
    for r in runs:
        cfg, summary, epochs = r.config, r.summary, r.curves.epochs
        if not epochs:
            scores = ["cut short before epoch 1 ended"] + [MISSING] * (len(quality) - 1)
        else:
            cut = "" if summary else f" (cut short after epoch {epochs[-1]['epoch']})"
            scores = [show(epochs[-1]) + cut for _, show in quality]
        speed, unit = throughput(summary) if summary else (
            (statistics.fmean(throughput(e)[0] for e in epochs), throughput(epochs[0])[1]) if epochs else (None, ""))
        sent = summary.get("iteration", {}).get("mean_bytes_sent")
        means = [_mean_counter(r, name) for name in counters]
        rows.append([str(r.path), cfg.get("model", "?"), exchange(r), cfg.get("batch_size", "?"),
                     summary.get("world_size", cfg.get("workers", "?")), *scores,
                     f"{summary['wall_time_s']:.1f}" if "wall_time_s" in summary else MISSING,
                     f"{speed:.0f} {unit}" if speed else MISSING, f"{sent / 1e6:.3g}" if sent is not None else MISSING,
                     *(f"{m:.3g}" if m is not None else MISSING for m in means)])
    return columns, rows


def _line(ax, points: list[tuple[float, float]], *fmt, **style) -> None:
    """Draw (x, y) points, if any (log axes leave out the values they cannot show: a rate of 0)."""
    if points:
        ax.plot(*zip(*points), *fmt, **style)


def plot(path: Path, runs: list[Compared], names: list[str]) -> None:
    """Loss, test accuracy (language models: validation loss) and learning rate (rows) against iterations and wall
    time (columns), a line per run."""
    plt = output.pyplot()
    ncol = 1 if len(runs) < 3 else 2
    legend_rows = -(-len(runs) // ncol)
    height = 9 + 0.17 * legend_rows
    fig, axes = plt.subplots(3, 2, figsize=(13, height), sharex="col")
    colours = [f"C{i}" for i in range(10)] if len(runs) <= 10 else [plt.cm.tab20(i % 20) for i in range(len(runs))]
    text = all(any("test_perplexity" in e for e in r.curves.epochs) for r in runs)  # language models: validation loss
    for i, (run, name) in enumerate(zip(runs, names)):
        iterations = [r["iter"] for r in run.curves.iters]
        for col, xs in enumerate((iterations, wall_clock(run))):
            if xs is None:
                continue  # cut short before its first epoch's speed was measured: no time axis
            x_of = dict(zip(iterations, xs))
            style = {"color": colours[i % len(colours)], "linestyle": DASHES[i % len(DASHES)]}  # runs that agree
            _line(axes[0, col], [(x, r["loss"]) for x, r in zip(xs, run.curves.iters) if r["loss"] > 0],
                  lw=0.8, label=name if col == 0 else None, **style)
            _line(axes[1, col], [(x_of[e["iter"]], e["test_loss"] if text else 100 * e["test_acc"])
                                 for e in run.curves.epochs if e["iter"] in x_of], marker="o", ms=3, **style)
            _line(axes[2, col], [(x, r["lr"]) for x, r in zip(xs, run.curves.iters) if r["lr"] > 0], lw=1, **style)
    for col, what in enumerate(("iteration", "wall time (s)")):
        axes[0, col].set_ylabel("training loss (per iteration)")
        axes[0, col].set_yscale("log")
        axes[0, col].yaxis.set_major_formatter(plt.matplotlib.ticker.LogFormatter())  # 2.1, not 2.1×10⁰
        axes[0, col].yaxis.set_minor_formatter(plt.matplotlib.ticker.LogFormatter(labelOnlyBase=False,
                                                                                  minor_thresholds=(1, 0.4)))
        axes[1, col].set_ylabel("validation loss (per epoch)" if text else "test accuracy (%, per epoch)")
        axes[2, col].set_ylabel("learning rate")
        axes[2, col].set_yscale("log")
        axes[2, col].set_xlabel(what)
        axes[0, col].set_title(f"against {what.split(' (')[0]}")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3, which="both")
    handles, texts = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, texts, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, (0.17 * legend_rows + 0.1) / height, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class CompareCommand(Options):
    """`scalesgd compare`: which runs, and where their figure and table go."""

    run_dirs: tuple[str, ...] = option((), "a `scalesgd train` run directory (finished or cut short), or a directory "
                                       "holding run directories, directly or in runs/ (a `scalesgd sweep` or `bench "
                                       "accuracy` --out): it stands for every run in it, in name order",
                                       positional="+")
    out: str = option("compare", "directory for compare.png and compare.md, created if missing", check=output_dir)


def run(cfg: CompareCommand, command: str) -> int:
    """Read every run (one line naming the first that is not one), then write compare.png and compare.md and show
    the table."""
    if not cfg.run_dirs:
        raise UsageError(f"no run directory given; {EXPECTED}")
    out = cfg.out
    runs = [load(path) for path in expand(list(cfg.run_dirs))]
    names = labels(runs)
    columns, rows = table(runs)
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    (target / MD_NAME).write_text(f"`{command}`\n\n" + output.markdown_table(columns, rows), encoding="utf-8")
    plot(target / PNG_NAME, runs, names)
    console = output.console()
    console.print(output.rich_table(f"{len(runs)} run(s) compared", columns, rows))
    console.print(f"written to {target}/{MD_NAME} and {PNG_NAME}", highlight=False)
    return 0
