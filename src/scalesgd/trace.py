"""A timeline of where each iteration's time goes, written as a Chrome trace for Perfetto."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch


def now_us() -> float:
    """Microseconds on the monotonic clock every process on a host shares."""
    return time.perf_counter_ns() / 1000.0


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on `device` (nothing to wait for on CPU), so a host clock read next sees it done."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceClock:
    """Marks in the device's own order (CUDA events on a GPU, the host clock on CPU) and the seconds between
    them, so a time read from hooks is the device's work, not when the host queued it."""

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        """Seconds from mark `start` to mark `end` (waits for `end` on a GPU)."""
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3


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
