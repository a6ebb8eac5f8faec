"""Work on daemon threads of its own: an exchange or a heal stuck on a peer that froze blocks neither the round's
retry nor the interpreter's exit."""

from __future__ import annotations

import threading
from concurrent.futures import Future


class DaemonThreads:
    """`submit(work)`: a Future of `work()`, run on a daemon thread of its own (as an executor's, never joined)."""

    def __init__(self, name: str = "scalesgd-elastic-round"):
        self.name = name

    def submit(self, work) -> Future:
        future: Future = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the round
                    future.set_exception(error)

        threading.Thread(target=run, name=self.name, daemon=True).start()
        return future

    def shutdown(self, wait: bool = True) -> None:
        """Nothing to stop: an exchange under way is the round's, and one abandoned is left where it is stuck."""
