"""What the benchmark keeps doing beside a run: a thread of its own from entering to leaving."""

from __future__ import annotations

import abc
import threading


class OnThread(abc.ABC):
    """`_run` on a daemon thread while inside; `_stop` is set on the way out, which then waits for the thread."""

    name = "bench"

    def __init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @abc.abstractmethod
    def _run(self) -> None:
        """What the thread does until `_stop` is set."""
