"""Steps to the target against the number of workers: each benchmark directory's rows (its raw.tar.xz quality.json)
merged into the shipped table's, then for every key measured at three counts or more, the power law fitted on all
but the largest predicts the largest (the held-out check). `--write` keeps the merged rows in the shipped table."""

import json
import sys
import tarfile
from pathlib import Path

from scalesgd.sim import quality
from scalesgd.sim.quality import StepsToTarget, scaling_in_workers


def rows_of(directory: Path) -> dict[str, StepsToTarget]:
    with tarfile.open(directory / "raw.tar.xz") as tar:
        record = json.load(tar.extractfile("quality.json"))
    return {k: StepsToTarget(**{**row, "by_workers": {}}) for k, row in record["steps_to_target"].items()}


def main(argv: list[str]) -> int:
    write = "--write" in argv
    tables = {family: quality.table(family) for family in quality.FAMILIES}
    tables["text"] = quality.merged([tables["text"], *(rows_of(Path(d)) for d in argv if d != "--write")])
    for key, row in sorted(tables["text"].items()):
        measured = {row.workers: row.factor, **row.by_workers}
        print(json.dumps({"key": key, "factor_by_workers": {m: measured[m] for m in sorted(measured)}}))
        reached = sorted(m for m, f in measured.items() if f is not None)
        if len(reached) >= 3:
            held = reached[-1]
            law = scaling_in_workers({m: measured[m] for m in reached[:-1]})
            predicted = law(held)
            print(json.dumps({"key": key, "fit_on": reached[:-1], "exponent": round(law.exponent, 4),
                              "held_out": held, "predicted": round(predicted, 4), "measured": measured[held],
                              "error": round(predicted / measured[held] - 1, 4),
                              "law_on_all": round(scaling_in_workers(measured).exponent, 4)}))
    if write:
        quality.write(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
