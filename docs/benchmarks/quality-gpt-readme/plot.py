"""The README's picture: validation loss against the training clock, one panel per link rate, from the 10 Mbit/s
100 Mbit/s and 1 Gbit/s `bench quality` records, 3 seeds each (the same reference, so the same target and bound).
Run from the repository root: python docs/benchmarks/quality-gpt-readme/plot.py"""

import json
import tarfile
from pathlib import Path

from scalesgd.bench.quality_report import plot

HERE = Path(__file__).parent


def record(name: str) -> dict:
    """A benchmark's quality.json, from its raw.tar.xz (where its runs are packed)."""
    with tarfile.open(HERE.parent / name / "raw.tar.xz") as archive:
        return json.load(archive.extractfile("quality.json"))


records = [record(name) for name in ("quality-gpt-10mbit-3seeds", "quality-gpt-100mbit-3seeds", "quality-gpt-1gbit")]
assert len({r["target"] for r in records}) == 1, "the records must share a reference"
runs = [run for record in records for run in record["runs"]]
first = records[0]
plot(HERE / "quality.png", runs, first["target"], first["compute_bound_s"], first["budget_s"], True)
print(f"written to {HERE / 'quality.png'}")
