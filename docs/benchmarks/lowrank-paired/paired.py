"""PowerSGD's hook against our low-rank modes round by round, from the testbed runs' raw output:
`python docs/benchmarks/lowrank-paired/paired.py`.

In each round of `bench train` the modes take turns within a minute, so the ratio of two modes' round medians cancels
most of the machine's slow and fast minutes, which move a whole run's medians. Prints, per link rate, the median over
every round of every run (with quartiles) of PowerSGD's time over each of ours, and of PowerSGD's time over the
compute-only step's (`none`)."""

import json
import statistics
from pathlib import Path

from scalesgd.bench.train_report import round_ratios

HERE = Path(__file__).resolve().parent.parent
RUNS = {  # rate: the run folders (blocks8: runs after lowrank worked a block of rows at a time)
    "1gbit": [f"testbed-1gbit-vgg16-2x1-blocks8-run{n}" for n in (1, 2, 3)],
    "200mbit": [f"testbed-200mbit-vgg16-2x1-blocks8-run{n}" for n in range(1, 7)],
    "100mbit": [f"testbed-100mbit-vgg16-2x1-blocks8-run{n}" for n in range(1, 9)],
    "50mbit": ["testbed-50-25mbit-vgg16-2x1-lowrank"],
    "25mbit": ["testbed-50-25mbit-vgg16-2x1-lowrank"],
    "10mbit": [f"testbed-10-5mbit-vgg16-2x1-lowrank-run{n}" for n in (1, 2, 3)],
    "5mbit": [f"testbed-10-5mbit-vgg16-2x1-lowrank-run{n}" for n in (1, 2, 3)],
}
OURS = ("scalesgd-lowrank@4/fp16", "scalesgd-lowrank-acp@4/fp16", "scalesgd-lowrank-acp@8/fp16")
REFERENCE = "ddp-powersgd"


def rows(folder: str, rate: str) -> dict[str, dict]:
    """Each mode's result row at this rate in one run."""
    results = json.loads((HERE / folder / "train.json").read_text())["results"]
    return {r["mode"]: r for r in results if r["bandwidth"] == rate}


def summary(values: list[float]) -> str:
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.3f} (quartiles {q1:.3f}–{q3:.3f})"


def main() -> None:
    for rate, folders in RUNS.items():
        pairs: dict[str, list[float]] = {mode: [] for mode in OURS + ("none",)}
        for folder in folders:
            modes = rows(folder, rate)
            for mode, ratios in pairs.items():
                ratios += round_ratios(modes[REFERENCE], modes[mode])
        print(f"{rate}: {len(folders)} run(s), {len(pairs['none'])} rounds")
        for mode in OURS:
            print(f"  PowerSGD ÷ {mode:28s} {summary(pairs[mode])}")
        print(f"  PowerSGD ÷ {'none (the bound)':28s} {summary(pairs['none'])}")


if __name__ == "__main__":
    main()
