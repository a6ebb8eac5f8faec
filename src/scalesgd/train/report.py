"""The end-of-run artefacts: summary.json, the rich summary table and report.png."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from scalesgd import output
from scalesgd.errors import UsageError
from scalesgd.periodic.schedule import Schedule
from scalesgd.train.metrics import read
from scalesgd.train.objective import throughput
from scalesgd.train.rundir import CONFIG_NAME, METRICS_NAME, REPORT_NAME, SUMMARY_NAME, write_json


def write_summary(run_dir: Path, summary: dict) -> None:
    write_json(Path(run_dir) / SUMMARY_NAME, summary)


def summary_table(summary: dict):
    """A rich table of the numbers a user looks for first."""
    table = Table(title="scalesgd run summary", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    cfg = summary["config"]
    speed, unit = throughput(summary)
    quality = ([("final validation loss", f"{summary['final_test_loss']:.4f} nats/token"),
                ("final perplexity", f"{summary['final_test_perplexity']:.3f}")]
               if "final_test_perplexity" in summary else
               [("final test accuracy", f"{100 * summary['final_test_acc']:.2f} %"),
                ("best test accuracy", f"{100 * summary['best_test_acc']:.2f} %")])
    rows = [
        ("model / dataset", f"{cfg['model']} / {cfg['dataset']}"),
        ("workers × per-worker batch", f"{cfg['workers']} × {batch_text(cfg)}"),
        ("peak learning rate", f"{summary['peak_lr']:.4g}"),
        ("epochs", epochs_trained(summary)),
        *quality,
        ("train throughput", f"{speed:.0f} {unit}"),
        *input_pipeline(summary),
        ("wall time", f"{summary['wall_time_s']:.1f} s"),
        ("run directory", summary["run_dir"]),
    ]
    for what, value in rows:
        table.add_row(what, value)
    return table


def input_pipeline(summary: dict) -> list[tuple[str, str]]:
    """For images streamed from files: how long a step waited for its batch, and the files left out."""
    timing = summary.get("iteration", {})
    if summary["config"]["dataset"] != "imagefolder" or "median_data_wait_s" not in timing:
        return []
    rows = [("waiting for data", f"{1e3 * timing['median_data_wait_s']:.1f} ms of a "
                                 f"{1e3 * timing['median_iteration_s']:.0f} ms step (median; mean "
                                 f"{1e3 * timing['mean_data_wait_s']:.1f} ms)")]
    if "skipped_images" in summary:
        rows.append(("images skipped", str(summary["skipped_images"])))
    return rows


def periodic_text(cfg: dict) -> str:
    """How often a run synchronised where it did so periodically ('' where it exchanged every step)."""
    schedule = Schedule.of(cfg)
    if schedule is None:
        return ""
    mix = f", α {cfg.get('mix', 0):g}" if cfg.get("mix") else ""
    return f"{schedule.describe()}{mix}"


def title(cfg: dict) -> str:
    """What a run trained, for report.png's title: model and data, how gradients travelled, the global batch."""
    chosen = "chosen by --exchange auto" if cfg.get("exchange") == "auto" else ""
    if cfg.get("local_steps"):
        return (f"{cfg['model']} on {cfg['dataset']} · {cfg['codec']} pseudo-gradient {periodic_text(cfg)}"
                f"{f' ({chosen})' if chosen else ''} · global batch {cfg['batch_size']}")
    auto = f", {chosen}" if chosen else ""
    workers = f"{cfg['workers']} worker{'s' if cfg['workers'] != 1 else ''}"
    precision = f" · {cfg['precision']}" if cfg.get("precision", "fp32") != "fp32" else ""
    return (f"{cfg['model']} on {cfg['dataset']} · codec {cfg['codec']} ({cfg['engine']} engine{auto}){precision} · "
            f"global batch {cfg['batch_size']} = {workers} × {batch_text(cfg)}")


def batch_text(cfg: dict) -> str:
    """Each worker's share of the global batch, as micro-batches where it accumulates them."""
    per_worker, parts = cfg["batch_size"] // cfg["workers"], cfg.get("accumulate", 1)
    return f"{per_worker}" if parts == 1 else f"{parts} × {per_worker // parts}"


def read_json(path: Path) -> dict:
    """A JSON file of a run; a damaged one is bad input naming it, an absent one is empty."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UsageError(f"{path} is not readable JSON; the run directory is damaged") from None


def run_config(run_dir: Path) -> dict:
    """A run's config: its summary's where written (that holds --exchange auto's choice), else config.json."""
    return read_json(Path(run_dir) / SUMMARY_NAME).get("config") or read_json(Path(run_dir) / CONFIG_NAME)


ITER_KEYS = ("kind", "epoch", "iter", "lr", "loss", "data_wait_s", "skipped", "loss_scale")  # the rest: codec counters


@dataclass
class Curves:
    """A run's metrics.jsonl as its plots use it, read in one place for report.png and `scalesgd compare`."""

    iters: list[dict]  # one per iteration: ITER_KEYS and the codec's counters once it has any
    epochs: list[dict]  # one per finished epoch: train and test loss and accuracy, images/s
    counters: list[str]  # the codec guardrail counters the iterations recorded, sorted


def read_curves(run_dir: Path) -> Curves:
    """The iteration and epoch records of a run directory (notices left out) and the counter names among them."""
    records = read(Path(run_dir) / METRICS_NAME)
    iters = [r for r in records if r["kind"] == "iter"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    return Curves(iters, epochs, sorted({k for r in iters for k in r} - set(ITER_KEYS)))


def epochs_trained(summary: dict) -> str:
    """The epochs trained, and --epochs beside them where AdaScale's scale-invariant schedule took more."""
    trained = summary.get("epochs_trained", summary["epochs"])
    if trained == summary["epochs"]:
        return str(trained)
    return f"{trained} (--epochs {summary['epochs']}, scale-invariant)"


def plot_noise_scale(ax, epochs: list[dict], batch: int | None) -> None:
    """B_simple at each epoch's end, and averaged over the run so far, against the global batch in use: above it,
    a larger batch would still pay."""
    for key, style, label in (("noise_scale", "o-", "noise scale B_simple (samples)"),
                              ("noise_scale_average", "--", "B_simple averaged over the run so far")):
        if any(key in e for e in epochs):  # runs logged before the average was kept have only the first
            ax.plot([e["iter"] for e in epochs], [float("nan") if e.get(key) is None else e[key] for e in epochs],
                    style, label=label)
    if batch:
        ax.axhline(batch, color="grey", ls="--", label=f"global batch {batch}")
    ax.set_ylabel("samples")
    output.log_scale(ax, nonpositive="mask")
    ax.legend(fontsize=8)


def plot_report(run_dir: Path) -> Path:
    """report.png: loss, accuracy (a language model's perplexity), learning rate, (for a lossy codec) its guardrail
    counters and (for images streamed from files) the time each step waited for its batch, against iterations."""
    plt = output.pyplot()

    curves = read_curves(run_dir)
    iters, epochs, counters = curves.iters, curves.epochs, curves.counters
    noise = [e for e in epochs if "noise_scale" in e]  # --noise-scale runs: B_simple per epoch
    waits = [r for r in iters if "data_wait_s" in r]
    panels = 3 + bool(counters) + bool(waits) + bool(noise)
    fig, axes = plt.subplots(panels, 1, figsize=(8, 3 * panels), sharex=True)
    ax_loss, ax_acc, ax_lr = axes[:3]
    ax_loss.plot([r["iter"] for r in iters], [r["loss"] for r in iters], lw=0.8, label="train (per iteration)")
    ends = [e["iter"] for e in epochs]
    ax_loss.plot(ends, [e["test_loss"] for e in epochs], "o-", label="test (per epoch)")
    ax_loss.set_ylabel("loss")
    output.log_scale(ax_loss)
    ax_loss.legend()
    if any("test_perplexity" in e for e in epochs):  # a language model: validation perplexity, e^(loss per token)
        ax_acc.plot(ends, [e["test_perplexity"] for e in epochs], "s-", label="validation")
        ax_acc.set_ylabel("perplexity")
        output.log_scale(ax_acc)
    else:
        ax_acc.plot(ends, [100 * e["train_acc"] for e in epochs], "o-", label="train")
        ax_acc.plot(ends, [100 * e["test_acc"] for e in epochs], "s-", label="test")
        ax_acc.set_ylabel("accuracy (%)")
    ax_acc.legend()
    ax_lr.plot([r["iter"] for r in iters], [r["lr"] for r in iters])
    ax_lr.set_ylabel("learning rate")
    output.log_scale(ax_lr, nonpositive="mask")  # decayed rates stay visible; a rate of 0 (cosine, poly) is left out
    if counters:
        for name in counters:
            axes[3].plot([r["iter"] for r in iters if name in r], [r[name] for r in iters if name in r], lw=0.8,
                         label=name)
        axes[3].set_ylabel("codec counters (fractions)")
        axes[3].legend(fontsize=8)
    if waits:
        ax_wait = axes[3 + bool(counters)]
        ax_wait.plot([r["iter"] for r in waits], [1e3 * r["data_wait_s"] for r in waits], lw=0.8,
                     label="rank 0's step waiting for its batch")
        ax_wait.set_ylabel("data wait (ms)")
        ax_wait.legend(fontsize=8)
    if noise:
        plot_noise_scale(axes[-1], noise, run_config(run_dir).get("batch_size"))
    axes[-1].set_xlabel("iteration")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title(run_config(run_dir))}\n{Path(run_dir).name}", fontsize=9)
    fig.tight_layout()
    out = Path(run_dir) / REPORT_NAME
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
