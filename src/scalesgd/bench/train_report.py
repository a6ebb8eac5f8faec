"""`scalesgd bench train`'s results: ratios against DDP fp32 and the compute-only bound with their spread over
rounds, the table, and the plot (bars at one link rate, lines against the rate in a sweep)."""

from __future__ import annotations

from pathlib import Path

from scalesgd import output
from scalesgd.units import mbit_s


def round_ratios(baseline: dict, row: dict) -> list[float]:
    """baseline ÷ mode round by round: round r of both is the same minute of the machine, so its slow and fast
    minutes cancel."""
    return [b / m for b, m in zip(baseline["round_medians_s"], row["round_medians_s"])]


def ratio_spread(baseline: dict, row: dict) -> tuple[float, float, float]:
    """baseline ÷ mode: over the whole run (median of medians) and its min and max over rounds."""
    ratios = round_ratios(baseline, row)
    return baseline["median_iteration_s"] / row["median_iteration_s"], min(ratios), max(ratios)


def add_ratios(results: list[dict]) -> None:
    """Each row's DDP fp32 ÷ mode and, where the run has it, none ÷ mode (how far from the compute-only bound),
    with their spread over rounds, against the baseline measured at the same link rate."""
    for baseline_mode, key in (("ddp", "ddp_ratio"), ("none", "bound_ratio")):
        baselines = {r["bandwidth"]: r for r in results if r["mode"] == baseline_mode}
        for row in results:
            if row["bandwidth"] in baselines:
                row[key] = ratio_spread(baselines[row["bandwidth"]], row)


def spread(ratio: tuple[float, float, float] | None) -> str:
    return f"{ratio[0]:.2f} ({ratio[1]:.2f}–{ratio[2]:.2f})" if ratio else ""


def write(out: Path, title: str, rates: tuple[str, ...], record: dict, command: str) -> None:
    """Table with each mode's time and its ratio to DDP fp32 (spread over rounds), JSON, Markdown and the PNG."""
    results = record["results"]
    add_ratios(results)
    columns = ["link", "mode", "median ms", "images/s", "ddp ÷ mode (rounds min–max)", "none ÷ mode", "compute ms",
               "CPU ms (comm thread)", "exposed comm ms", "overlapped comm ms", "MB sent / iter",
               "planned groups or auto's choice, predicted ÷ measured"]
    rows = [[r["bandwidth"] or "as is", r["mode"], f"{1e3 * r['median_iteration_s']:.1f}",
             f"{r['images_per_s']:.0f}", spread(r.get("ddp_ratio")), spread(r.get("bound_ratio")),
             f"{1e3 * r['mean_compute_s']:.1f}",
             f"{1e3 * r['mean_cpu_s']:.0f}" + (f" ({1e3 * r['mean_thread_cpu_s']:.0f})" if "mean_thread_cpu_s" in r else ""),
             f"{1e3 * r['mean_exposed_s']:.1f}" if "mean_exposed_s" in r else "",
             f"{1e3 * r['mean_overlapped_s']:.1f}" if "mean_overlapped_s" in r else "",
             f"{r['mean_bytes_sent'] / 1e6:.2f}" if "mean_bytes_sent" in r else "",
             _prediction(r)]
            for r in results]
    output.write(out, "train", record, columns, rows, command)
    if rates:
        plot_rates(out / "train.png", title, rates, results)
    else:
        plot(out / "train.png", title, results)
    output.console().print(output.rich_table(title, columns, rows))
    output.console().print(f"written to {out}/train.{{json,md,png}}", highlight=False)


def _prediction(r: dict) -> str:
    """The planner's groups or auto's choice, and the model's iteration against the measured one."""
    if "auto_choice" in r:
        return f"{r['auto_choice']}, {r['predicted_s'] / r['median_iteration_s']:.2f}"
    if "planned_groups" in r:
        return f"{r['planned_groups']}, {r['predicted_s'] / r['measured_exchange_end_s']:.2f}"
    return ""


def plot(path: Path, title: str, results: list[dict]) -> None:
    plt = output.pyplot()

    fig, ax = plt.subplots(figsize=(8, 0.45 * len(results) + 1.5))
    names = [r["mode"] for r in results][::-1]
    ax.barh(names, [1e3 * r["median_iteration_s"] for r in results][::-1], color="tab:blue")
    ax.set_xlabel("median iteration time (ms)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rates(path: Path, title: str, rates: tuple[str, ...], results: list[dict]) -> None:
    """Iteration time against link rate, one line per mode, bars spanning the round medians; `none` (the
    compute-only bound) dashed."""
    plt = output.pyplot()

    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [mbit_s(rate) for rate in rates]
    for mode in dict.fromkeys(r["mode"] for r in results):
        rows = [next(r for r in results if r["mode"] == mode and r["bandwidth"] == rate) for rate in rates]
        ys = [1e3 * r["median_iteration_s"] for r in rows]
        low = [y - 1e3 * min(r["round_medians_s"]) for y, r in zip(ys, rows)]
        high = [1e3 * max(r["round_medians_s"]) - y for y, r in zip(ys, rows)]
        style = dict(linestyle="--", color="black") if mode == "none" else {}
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3,
                    label="none (compute-only bound)" if mode == "none" else mode, **style)
    ax.set_xscale("log")
    ax.set_xticks(xs, rates)
    ax.set_xlabel("link rate (each node, both ways)")
    ax.set_ylabel("median iteration time (ms); bars: round medians min–max")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
