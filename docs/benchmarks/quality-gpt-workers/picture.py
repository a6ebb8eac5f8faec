"""Time to the target against the number of workers, per exchange and link: every `bench quality` call's record kept
under DIR/calls/ (run.sh keeps one per call), drawn one panel a link into time-to-target.png beside this script (or
`--picture PATH`), with each M's compute-only bound; prints the points drawn, one JSON line each."""

import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fit import calls_of, picture_and_rest, workers_of  # noqa: E402


def points(directories: list[Path]) -> list[dict]:
    """One point per (link, M, exchange): from the call that ran it over the most seeds (the later one on a tie)."""
    best: dict[tuple, dict] = {}
    for directory in directories:
        for path, record in calls_of(directory):
            workers = workers_of(record)
            for row in record["summary"]:
                reached = row["reached"] * 2 > row["seeds"]  # most of its seeds reached the target
                point = {"link": row["rate"], "workers": workers, "exchange": row["label"], "seeds": row["seeds"],
                         "reached": row["reached"], "bound_s": record["compute_bound_s"],
                         "budget_s": record["budget_s"],
                         "time_s": statistics.median(row["time_s"]) if reached else None,
                         "min_s": min(row["time_s"]) if reached else None,
                         "max_s": max(row["time_s"]) if reached else None, "source": str(path)}
                key = (point["link"], workers, point["exchange"])
                if key not in best or point["seeds"] >= best[key]["seeds"]:
                    best[key] = point
    return [best[k] for k in sorted(best)]


def draw(drawn: list[dict], picture: Path) -> None:
    """A panel per link: each exchange's median time (min–max bars) against M; a missed target as ▲ at the budget."""
    from PIL import Image

    from scalesgd import output

    plt = output.pyplot()
    links = sorted({p["link"] for p in drawn}, key=lambda link: float(re.match(r"[\d.]*", link).group() or 0))
    fig, axes = plt.subplots(1, len(links), figsize=(6.5 * len(links), 4.6), squeeze=False)
    exchanges = sorted({p["exchange"] for p in drawn})
    colours = {name: f"C{i}" for i, name in enumerate(exchanges)}
    for ax, link in zip(axes[0], links):
        mine = [p for p in drawn if p["link"] == link]
        counts = sorted({p["workers"] for p in mine})  # each call measured its bound: the least disturbed, per M
        bound = [min(p["bound_s"] for p in mine if p["workers"] == m) for m in counts]
        ax.plot(counts, bound, "k--", marker="s", label="compute-only bound (DDP fp32, local)")
        for i, name in enumerate(exchanges):
            ours = sorted((p for p in mine if p["exchange"] == name), key=lambda p: p["workers"])
            hit = [p for p in ours if p["time_s"] is not None]
            apart = 2 ** (0.03 * (i - len(exchanges) / 2))  # exchanges side by side at each M
            if hit:
                ax.errorbar([p["workers"] * apart for p in hit], [p["time_s"] for p in hit],
                            yerr=[[p["time_s"] - p["min_s"] for p in hit], [p["max_s"] - p["time_s"] for p in hit]],
                            marker="o", capsize=3, color=colours[name],
                            label=f"{name} ({'/'.join(str(p['seeds']) for p in hit)} seeds)")
            missed = [p for p in ours if p["time_s"] is None]
            if missed:
                ax.plot([p["workers"] * apart for p in missed], [p["budget_s"] for p in missed], "^",
                        color=colours[name], markerfacecolor="none", label=f"{name}: not reached in the budget")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(counts, [str(m) for m in counts])
        ax.set_xlim(min(counts) / 1.4, max(counts) * 1.4)
        ax.set_xlabel("workers M (testbed nodes × 1, global batch 64)")
        ax.set_ylabel("seconds to the target (median, min–max)")
        ax.set_title(f"the default GPT, {link} each way")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(picture, dpi=110)
    plt.close(fig)
    Image.open(picture).convert("RGB").quantize(64).save(picture, optimize=True)  # a third of the bytes, alike


def main(argv: list[str]) -> int:
    picture, rest = picture_and_rest(argv, "time-to-target.png")
    directories = [Path(a) for a in rest]
    drawn = points(directories)
    for point in drawn:
        print(json.dumps(point))
    draw(drawn, picture)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
