"""A timeline of where each iteration's time goes, written as a Chrome trace for Perfetto."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path


def now_us() -> float:
    """Microseconds on the monotonic clock every process on a host shares."""
    return time.perf_counter_ns() / 1000.0


class Tracer:
    """Collects complete spans (name, thread, start, duration) from any thread; off costs almost nothing."""

    def __init__(self, enabled: bool = False):
        self.enabled = enabled
        self.events: list[dict] = []
        self._lock = threading.Lock()

    @contextmanager
    def span(self, name: str, thread: str = "main", **args):
        if not self.enabled:
            yield
            return
        start = now_us()
        try:
            yield
        finally:
            self.add(name, start, now_us(), thread, **args)

    def add(self, name: str, start_us: float, end_us: float, thread: str = "main", **args) -> None:
        if self.enabled:
            with self._lock:
                self.events.append({"name": name, "ts": start_us, "dur": end_us - start_us,
                                    "thread": thread, "args": args})


def chrome_trace(events_per_rank: list[list[dict]]) -> dict:
    """The Chrome trace-event JSON: one process row per rank, one thread row per thread name."""
    out, threads = [], {}
    origin = min((e["ts"] for events in events_per_rank for e in events), default=0.0)
    for rank, events in enumerate(events_per_rank):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for e in events:
            key = (rank, e["thread"])
            if key not in threads:
                threads[key] = len(threads) + 1
                out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": threads[key],
                            "args": {"name": e["thread"]}})
            out.append({"ph": "X", "name": e["name"], "pid": rank, "tid": threads[key],
                        "ts": e["ts"] - origin, "dur": e["dur"], "args": e["args"]})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(path: Path, events_per_rank: list[list[dict]]) -> None:
    Path(path).write_text(json.dumps(chrome_trace(events_per_rank)), encoding="utf-8")
