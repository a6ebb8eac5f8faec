"""The loss window's reads: every `sync_every` steps one allreduce sums the window's rows (loss, correct, samples,
squared gradient norms, one row a step) and rank 0's flags (a checkpoint due, the time budget spent) across the
members, and the host reads them. In a fixed group the allreduce is started at the window's end and read at the
next window's, so no step waits for a slow link's round trip; the members then agree one window later. Where the
group may change between windows, or the next window's steps depend on the sums (AdaScale's gain), it is read at
once."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from scalesgd.comm.wire.membership import Membership
from scalesgd.errors import NonFiniteLoss
from scalesgd.train import metrics
from scalesgd.train.progress import EpochProgress

COLUMNS = 5  # loss, correct, samples, the local and the exchanged gradient's squared norms


@dataclass
class Read:
    """The windows whose sums are in: their rows, summed across the members, and whether any rank said a
    checkpoint is due or the time budget spent."""

    rows: torch.Tensor
    due: bool = False
    spent: bool = False

    def then(self, later: Read) -> Read:
        return Read(torch.cat([self.rows, later.rows]), self.due or later.due, self.spent or later.spent)


@dataclass
class Sent:
    """A window's allreduce: its rows (the flags last), the work in flight (None: done), its iterations' records."""

    rows: torch.Tensor
    work: object
    records: list[dict]


class WindowReads:
    """Sends each window's sums and reads them: the window before where `lagged`, else the window itself."""

    def __init__(self, members: Membership, log: metrics.MetricsLog | None, progress: EpochProgress, lagged: bool):
        self.members, self.log, self.progress, self.lagged = members, log, progress, lagged
        self.in_flight: Sent | None = None

    def send(self, window: torch.Tensor, n: int, flags: tuple[bool, bool], records: list[dict]) -> Read:
        """Start the allreduce of the window's first `n` rows and `flags`; what is read now: the window sent before
        this one where lagged (nothing at the first), else this one."""
        window[-1, :2] = torch.tensor([float(f) for f in flags], dtype=window.dtype)
        rows = torch.cat([window[:n], window[-1:]])
        if not self.lagged:
            self.members.all_reduce(rows)
            self.in_flight = Sent(rows, None, records)
            return self.drain()
        work = self.members.all_reduce_started(rows)
        earlier, self.in_flight = self.drain(), Sent(rows, work, records)
        return earlier

    def drain(self) -> Read:
        """The window in flight, waited for and its iterations logged (no rows where none is).

        Raises NonFiniteLoss at the first iteration whose global loss is not finite.
        """
        sent, self.in_flight = self.in_flight, None
        if sent is None:
            return Read(torch.zeros(0, COLUMNS, dtype=torch.float64))
        if sent.work is not None:
            sent.work.wait()
        sums = sent.rows.cpu()
        for (loss, _, samples, *_), record in zip(sums[:-1].tolist(), sent.records):
            step_loss = loss / samples
            if not math.isfinite(step_loss):
                raise NonFiniteLoss(f"loss became {step_loss} at epoch {record['epoch']}, iteration {record['iter']}")
            notices = record.pop("notices")
            if self.log:
                self.log.write({**record, "loss": step_loss})
                for notice in notices:
                    self.log.write({"kind": "notice", "epoch": record["epoch"], "iter": record["iter"],
                                    "text": notice})
            for notice in notices:
                self.progress.message(f"iteration {record['iter']}: {notice}")
            self.progress.advance(step_loss, record["lr"])
        if self.log:
            self.log.flush()  # its steps readable at once by whoever watches the run (a fault's cost is read there)
        return Read(sums[:-1], bool(sums[-1, 0] > 0), bool(sums[-1, 1] > 0))
