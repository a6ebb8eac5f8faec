"""metrics.jsonl: one line per iteration and one per epoch, appended as training goes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from scalesgd.errors import UsageError


class MetricsLog:
    """Append-only JSON-lines log, flushed at each epoch so a crash loses at most one epoch."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read(path: Path) -> list[dict]:
    """Every record of a metrics file, in order; a last line torn by a kill mid-write is dropped, any other
    unreadable line is bad input (UsageError naming it)."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # torn: the writer died in the middle of it
            raise UsageError(f"{path} line {number} is not a JSON record; the run's metrics are damaged") from None
    return records


def truncate_after(path: Path, iteration: int) -> None:
    """Drop the records after global `iteration` (a resumed run repeats them) and a torn last line."""
    kept = [r for r in read(path) if r["iter"] <= iteration]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    os.replace(tmp, path)  # a kill now leaves the old file or the new one, never half of one
