"""What rank 0 shows while training: a rich bar on a terminal, plain lines otherwise, or nothing."""

from __future__ import annotations

import sys

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from scalesgd import output
from scalesgd.train.objective import throughput


class EpochProgress:
    """One progress bar per epoch (terminal), one line per epoch (pipe), silence (`quiet`)."""

    def __init__(self, enabled: bool, total_epochs: int | str):
        """`total_epochs`: shown after each epoch's number (a bound, such as "≤64", where the run decides its end)."""
        self.enabled = enabled
        self.total_epochs = total_epochs
        self.console = output.console(file=sys.stdout)
        self._bar: Progress | None = None
        self._task = None

    def start_epoch(self, epoch: int, steps: int) -> None:
        if not (self.enabled and self.console.is_terminal):
            return
        self._bar = Progress(TextColumn(f"epoch {epoch}/{self.total_epochs}"), BarColumn(),
                             MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                             console=self.console, transient=True)
        self._bar.start()
        self._task = self._bar.add_task("train", total=steps, info="")

    def advance(self, loss: float, lr: float) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=f"loss {loss:.4f} lr {lr:.4g}")

    def end_epoch(self, record: dict) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self.enabled:
            speed, unit = throughput(record)
            test = (f"val loss {record['test_loss']:.4f}  perplexity {record['test_perplexity']:.3f}"
                    if "test_perplexity" in record else
                    f"train {100 * record['train_acc']:.2f}%  test {100 * record['test_acc']:.2f}%")
            self.console.print(f"epoch {record['epoch']}/{self.total_epochs}  loss {record['train_loss']:.4f}  {test}  "
                               f"{speed:.0f} {unit}  lr {record['lr']:.4g}", highlight=False)

    def message(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, highlight=False)

    def table(self, table) -> None:
        if self.enabled:
            self.console.print(table)
