"""metrics.jsonl: one line per iteration and one per epoch, appended as training goes."""

from __future__ import annotations

import json
from pathlib import Path


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
    """Every record of a metrics file, in order."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def truncate_after_epoch(path: Path, epoch: int) -> None:
    """Drop the records of epochs after `epoch` (a resumed run repeats them)."""
    kept = [r for r in read(path) if r["epoch"] <= epoch]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
