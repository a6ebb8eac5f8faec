"""`scalesgd bench quality`'s report: per link rate and exchange, the time, steps and bytes to the target over the
seeds (median, min–max), how that compares with DDP and its hooks and with the compute-only bound, the loss at the
budget; the plot of validation loss (or accuracy) against the training clock, one panel per rate."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

from scalesgd import output
from scalesgd.sim import quality
from scalesgd.sim.quality import FAMILIES, StepsToTarget, family_of

REFERENCE_FAMILY = "ddp"  # labels of DDP and PyTorch's hooks start so: the baselines a speed-up is measured against


def is_text(runs: list[dict]) -> bool:
    """Whether the runs trained a language model (compared by validation loss, else by accuracy)."""
    return all(r["text"] for r in runs)


def target_of(reference: list[dict], slack: float) -> float:
    """The reference's median final loss × (1 + slack), or its median accuracy − slack/2."""
    if is_text(reference):
        return statistics.median(r["final_test_loss"] for r in reference) * (1 + slack)
    return statistics.median(r["final_test_acc"] for r in reference) - slack / 2


def curve(run: dict, text: bool) -> list[tuple[int, float, float, int | None]]:
    """(steps, training seconds, loss or accuracy, bytes) at each evaluation, the run's end last."""
    key = "test_loss" if text else "test_acc"
    points = [(e["iter"], e["train_s"], e[key], e.get("link_bytes_sent", e.get("bytes_sent"))) for e in run["evals"]]
    final = run["final_test_loss"] if text else run["final_test_acc"]
    last_bytes = points[-1][3] if points else None
    if not points or run["steps"] > points[-1][0] or final != points[-1][2]:
        points.append((run["steps"], run["train_s"], final, last_bytes))
    return points


def checkpoints_by(run: dict, steps: int) -> float:
    """The seconds of the run's training clock its checkpoints took up to `steps` (0 where the run kept none:
    before they were on the clock)."""
    at = [e for e in run["evals"] if e["iter"] == steps]
    return at[0].get("checkpoint_s", 0.0) if at else run.get("checkpoint_s", 0.0)


def reached(run: dict, target: float, text: bool) -> tuple[int, float, int | None] | None:
    """(steps, seconds, bytes) at the first evaluation at the target; None where the run never reached it."""
    for steps, seconds, value, sent in curve(run, text):
        if (value <= target) if text else (value >= target):
            return steps, seconds, sent
    return None


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "—"
    med = statistics.median(values)
    return fmt.format(med) + (f" ({fmt.format(min(values))}–{fmt.format(max(values))})" if len(values) > 1 else "")


def summarise(runs: list[dict], target: float, text: bool, reference_steps: float, bound_s: float) -> list[dict]:
    """Per (rate, exchange): time, steps and bytes to the target over the runs that reached it, and the loss at
    the end (the budget, or the run's token budget where it finished sooner)."""
    rows = []
    for rate in dict.fromkeys(r["rate"] for r in runs):
        for label in dict.fromkeys(r["label"] for r in runs if r["rate"] == rate):
            mine = [r for r in runs if r["rate"] == rate and r["label"] == label]
            every = [reached(r, target, text) for r in mine]
            hits = [h for h in every if h is not None]
            checkpoints = [checkpoints_by(r, h[0]) for r, h in zip(mine, every) if h is not None]
            end = [r["final_test_loss"] if text else r["final_test_acc"] for r in mine]
            finished = [(h, e) for r, h, e in zip(mine, every, end) if not r["stopped"]]
            rows.append({"rate": rate, "label": label, "seeds": len(mine), "reached": len(hits),
                         "time_s": [h[1] for h in hits], "checkpoint_s": checkpoints, "steps": [h[0] for h in hits],
                         "bytes": [h[2] for h in hits if h[2] is not None], "end": end,
                         "within_3x_steps": sum(h[0] <= 3 * reference_steps for h in hits),
                         "trained": [r["steps"] for r in mine],
                         "finished_end": [e for _, e in finished],
                         "ran_out": sum(h is None for h, _ in finished),  # all their steps, short of the target
                         "bound_ratio": [h[1] / bound_s for h in hits]})
    return rows


def steps_to_target(rows: list[dict], options: dict[str, str], key, reference_steps: float,
                    source: str, workers: int = 2) -> dict[str, StepsToTarget]:
    """Each exchange's steps to the target over the reference's, pooled over rates (they do not depend on the link)
    and over the runs that tell (a run the budget cut short before the target tells nothing): reached where most of
    those did (their median), missed where most ran all their steps without reaching it. `key(options)` names it
    ("": left out); `workers`: the runs' worker count."""
    table = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        steps = [s for r in mine for s in r["steps"]]
        ran_out = sum(r["ran_out"] for r in mine)
        if not steps and not ran_out:
            continue
        factor = statistics.median(steps) / reference_steps if len(steps) > ran_out else None
        name = key(options[label])
        if not name:
            continue
        ends = [e for r in mine for e in r["finished_end"]] or [e for r in mine for e in r["end"]]
        table[name] = StepsToTarget(name, options[label], factor, statistics.median(ends), len(steps) + ran_out,
                                    source, workers)
    return table


def write(out: Path, cfg, reference: list[dict], runs: list[dict], budget_s: float, command: str, key) -> None:
    text = is_text(reference)
    target = target_of(reference, cfg.slack)
    hits = [reached(r, target, text) for r in reference]
    ref_steps = statistics.median(h[0] for h in hits if h) if any(hits) else float("nan")
    bound_s = statistics.median(h[1] for h in hits if h) if any(hits) else float("nan")
    rows = summarise(runs, target, text, ref_steps, bound_s)
    columns = ["rate", "exchange", "reached", "time to target s", "of it, checkpoints s",
               f"× best {REFERENCE_FAMILY}*", "× compute bound",
               "steps to target", "MB to target (node 0's link)", "steps trained",
               "loss at end" if text else "accuracy at end", "≤ 3× fp32's steps"]
    table = []
    for row in rows:
        family = [r for r in rows if r["rate"] == row["rate"] and r["label"].startswith(REFERENCE_FAMILY)
                  and r["reached"] == r["seeds"]]
        best = min((statistics.median(r["time_s"]) for r in family), default=None)
        mine = statistics.median(row["time_s"]) if row["reached"] == row["seeds"] else None
        versus = (f"{best / mine:.2f}× sooner" if best and mine else
                  f"> {budget_s / mine:.2f}× sooner (none within the budget)" if mine and not family else "—")
        table.append([row["rate"], f"`{row['label']}`", f"{row['reached']}/{row['seeds']}", spread(row["time_s"]),
                      spread(row["checkpoint_s"], "{:.2f}"), versus, spread(row["bound_ratio"], "{:.2f}"),
                      spread(row["steps"], "{:.0f}"),
                      spread([b / 1e6 for b in row["bytes"]], "{:.2f}"), spread(row["trained"], "{:.0f}"),
                      spread(row["end"], "{:.4f}"),
                      f"{row['within_3x_steps']}/{row['seeds']}"])
    record = {"config": cfg.to_dict(), "target": target, "metric": "test_loss" if text else "test_acc",
              "compute_bound_s": bound_s, "reference_steps_to_target": ref_steps, "budget_s": budget_s,
              "reference": reference, "runs": runs, "summary": rows}
    label, given = cfg.reference_entry
    steps = steps_to_target(summarise(reference, target, text, ref_steps, bound_s) + rows,
                            {**dict(cfg.exchanges), label: given}, key, ref_steps, str(out),
                            reference[0].get("workers", 2))
    record["steps_to_target"] = {k: asdict(v) for k, v in steps.items()}
    if cfg.table:
        path, family = Path(cfg.table), family_of(text)
        tables = {f: quality.table(f, path) for f in FAMILIES}
        tables[family] = quality.merged([tables[family], steps])
        quality.write(tables, path)
    output.write(out, "quality", record, columns, table, command)
    plot(out / "quality.png", runs, target, bound_s, budget_s, text)
    output.console().print(output.rich_table(
        f"time to {'loss' if text else 'accuracy'} {target:.4f} (compute-only bound {bound_s:.1f} s)", columns, table))
    output.console().print(f"written to {out}/quality.{{json,md,png}}", highlight=False)


def plot(path: Path, runs: list[dict], target: float, bound_s: float, budget_s: float, text: bool) -> None:
    plt = output.pyplot()
    rates = list(dict.fromkeys(r["rate"] for r in runs))
    labels = list(dict.fromkeys(r["label"] for r in runs))
    colours = {label: plt.get_cmap("tab20")(i % 20) for i, label in enumerate(labels)}
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for label in labels:
            for i, run in enumerate(r for r in runs if r["rate"] == rate and r["label"] == label):
                points = curve(run, text)
                ax.plot([p[1] for p in points], [p[2] for p in points], color=colours[label], lw=1.2, alpha=0.8,
                        label=label if i == 0 else None)
        ax.axhline(target, color="black", ls="--", lw=0.8, label="target")
        ax.axvline(bound_s, color="grey", ls=":", lw=0.8, label="compute-only bound")
        ax.set_xlim(0, budget_s)
        ax.set_title(f"link {rate}")
        ax.set_xlabel("training seconds (evaluations left out)")
        ax.set_ylabel("validation loss" if text else "test accuracy")
        ax.grid(alpha=0.3)
    named = {}  # every exchange once, whichever panel drew it: a rate's panel may lack some
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            named.setdefault(label, handle)
    axes[0][-1].legend(named.values(), named.keys(), fontsize=7, loc="upper right" if text else "lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
