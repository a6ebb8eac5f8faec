"""Signs of life from each worker to its launcher, so a worker that stopped (SIGSTOP, a frozen host) is named
rather than the peers that timed out waiting for it; and, in the same file, the one line a failing worker leaves for
its launcher to say (why it failed), so a run ends with one line however many ranks saw the cause."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

HEARTBEAT_FILE = "SCALESGD_HEARTBEAT"  # the file a worker touches; set by the launcher
INTERVAL_S = 1.0
SILENT_AFTER_S = 5.0  # beats missed for this long: the worker is not running (a busy one still beats)
STARTUP_GRACE_S = 30.0  # before its first beat a worker is importing torch, seconds on a loaded machine
_beating: list[str] = []  # this worker's heartbeat file, once it beats: where its note goes


def beat_in_background(environ=os.environ) -> None:
    """In a worker we launched: touch the launcher's file every `INTERVAL_S` from a daemon thread."""
    path = environ.pop(HEARTBEAT_FILE, None)
    if path is None:
        return
    _beating[:] = [path]

    def beat() -> None:
        while True:
            try:
                os.utime(path)
            except OSError:  # the launcher removed it: it is ending the run
                return
            time.sleep(INTERVAL_S)

    threading.Thread(target=beat, name="scalesgd-heartbeat", daemon=True).start()


def leave_note(line: str) -> bool:
    """Leave `line` (why this worker is failing) for our launcher to say once for the run; False where no launcher of
    ours reads it (torchrun, a plain process): the caller says it itself then."""
    if not _beating:
        return False
    try:
        Path(_beating[0]).write_text(line.replace("\n", " ") + "\n", encoding="utf-8")
    except OSError:  # the launcher is gone or ending the run
        return False
    return True


class Heartbeats:
    """The launcher's side: one file per worker, and which workers have gone silent."""

    def __init__(self, workers: int):
        self.dir = Path(tempfile.mkdtemp(prefix="scalesgd-heartbeat-"))
        self.files = [self.dir / f"rank-{r}" for r in range(workers)]
        first_due = time.time() + STARTUP_GRACE_S
        for f in self.files:
            f.touch()
            os.utime(f, (first_due, first_due))  # a worker still starting counts from its launch, plus the grace

    def env(self, rank: int) -> dict:
        return {HEARTBEAT_FILE: str(self.files[rank])}

    def silent(self, ranks: list[int], longer_than_s: float = SILENT_AFTER_S) -> list[tuple[int, float]]:
        """(rank, seconds since its last beat) of those of `ranks` silent for longer than `longer_than_s`."""
        now = time.time()
        ages = [(r, now - self.files[r].stat().st_mtime) for r in ranks]
        return [(r, age) for r, age in ages if age > longer_than_s]

    def note(self, rank: int) -> str:
        """The line worker `rank` left saying why it failed, or ""."""
        try:
            return self.files[rank].read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
