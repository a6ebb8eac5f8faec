"""Steps to the target against the number of workers: each benchmark directory's rows (every call's record in calls/)
merged into the shipped table's, then for every key measured at three counts or more, the power law fitted on all
but the largest predicts the largest (the held-out check), drawn in fit.png beside this script (or `--picture PATH`).
`--write` keeps the merged rows in the shipped table."""

import json
import lzma
import sys
import tarfile
from pathlib import Path

from scalesgd.sim import quality
from scalesgd.sim.quality import StepsToTarget, scaling_in_workers


def workers_of(record: dict) -> int:
    """The run's worker count: recorded by `bench quality` since it measured more than two, else its --workers."""
    if "workers" in record["reference"][0]:
        return record["reference"][0]["workers"]
    args = record["config"]["train_args"]
    return int(args[args.index("--workers") + 1])


def calls_of(directory: Path) -> list[tuple[Path, dict]]:
    """(path, record) of every call run.sh kept in DIR/calls/, packed: the order of their names."""
    return [(path, json.loads(lzma.decompress(path.read_bytes())))
            for path in sorted((directory / "calls").glob("*.json.xz"))]


def rows_of(directory: Path) -> list[dict[str, StepsToTarget]]:
    """Every call's rows (calls/*.json.xz, as run.sh keeps them), else the last call's (raw.tar.xz's quality.json)."""
    records = [record for _, record in calls_of(directory)]
    if not records:
        with tarfile.open(directory / "raw.tar.xz") as tar:
            records = [json.load(tar.extractfile("quality.json"))]
    return [{k: StepsToTarget(**{**row, "workers": row.get("workers") or workers_of(record), "by_workers": {}})
             for k, row in record.get("steps_to_target", {}).items()} for record in records]


def draw(fits: list[tuple], picture: Path) -> None:
    """Steps to the target over DDP's against M, a colour a key: the counts measured, the law fitted without the
    largest (dashed) and on all (dotted)."""
    from scalesgd import output

    plt = output.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    grid = [2 ** (i / 8) for i in range(8, 8 * 10 + 1)]
    for (key, measured, held_out, on_all), colour in zip(fits, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        ms = sorted(m for m, f in measured.items() if f is not None)
        ax.plot(ms, [measured[m] for m in ms], "o", color=colour, label=f"{key}: measured")
        ax.plot(grid, [held_out(m) for m in grid], "--", color=colour,
                label=f"fitted on {ms[:-1]}: M^{held_out.exponent:.2f}")
        ax.plot(grid, [on_all(m) for m in grid], ":", color=colour, label=f"on all: M^{on_all.exponent:.2f}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers M (global batch fixed)")
    ax.set_ylabel("steps to the target ÷ DDP's")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(picture, dpi=110)
    plt.close(fig)


def picture_and_rest(argv: list[str], default: str) -> tuple[Path, list[str]]:
    """`--picture PATH` (else `default` beside these scripts), and the other arguments."""
    picture = Path(argv[argv.index("--picture") + 1]) if "--picture" in argv else Path(__file__).with_name(default)
    return picture, [a for i, a in enumerate(argv) if a != "--picture" and (i == 0 or argv[i - 1] != "--picture")]


def main(argv: list[str]) -> int:
    write = "--write" in argv
    picture, argv = picture_and_rest(argv, "fit.png")
    tables = {family: quality.table(family) for family in quality.FAMILIES}
    calls = [rows for d in argv if d != "--write" for rows in rows_of(Path(d))]
    tables["text"] = quality.merged([tables["text"], *calls])
    fits = []
    for key, row in sorted(tables["text"].items()):
        measured = {row.workers: row.factor, **row.by_workers}
        print(json.dumps({"key": key, "factor_by_workers": {m: measured[m] for m in sorted(measured)}}))
        reached = sorted(m for m, f in measured.items() if f is not None)
        if len(reached) >= 3:
            held = reached[-1]
            law = scaling_in_workers({m: measured[m] for m in reached[:-1]})
            predicted, on_all = law(held), scaling_in_workers(measured)
            fits.append((key, measured, law, on_all))
            print(json.dumps({"key": key, "fit_on": reached[:-1], "exponent": round(law.exponent, 4),
                              "held_out": held, "predicted": round(predicted, 4), "measured": measured[held],
                              "error": round(predicted / measured[held] - 1, 4),
                              "law_on_all": round(on_all.exponent, 4)}))
    if fits:
        draw([f for f in fits if f[2].exponent > 0], picture)  # DDP's own (M^0: 1 at every M) left out
    if write:
        quality.write(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
