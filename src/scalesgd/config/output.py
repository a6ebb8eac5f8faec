"""`scalesgd train`'s output options: where a run's files go, how often it checkpoints, what it prints and
measures beside training."""

from __future__ import annotations

import re
from dataclasses import dataclass

from scalesgd import checks
from scalesgd.options import option

EVERY = re.compile(r"^(\d+(?:\.\d+)?)(min)?$")  # --checkpoint-every: steps, or minutes
MAX_EVERY = 1e9  # steps or minutes: more is never


def _every(text: str) -> str | None:
    match = EVERY.match(text)
    return None if match and float(match[1]) <= MAX_EVERY else \
        f"use 0, a number of steps (200) or minutes (10min), at most {MAX_EVERY:.0e}"


@dataclass
class OutputConfig:
    """What a run writes, prints and measures."""

    run_dir: str = option("", "where results go", shown_default="runs/<timestamp>", runtime=True,
                          check=checks.output_dir)
    checkpoint_every: str = option("0", "also checkpoint mid-epoch, every N steps or every Nmin minutes, so a kill "
                                   "loses at most that (each epoch's end always checkpoints); 0: epochs only",
                                   runtime=True, check=_every)
    trace: str = option("", "write a Chrome trace (open in Perfetto) of the last epoch to this file", runtime=True,
                        check=checks.output_file)
    quiet: bool = option(False, "print nothing while training", runtime=True)
    sync_every: int = option(10, "iterations between reads of the loss on the host (one allreduce of their "
                             "losses, read at the next read in a fixed group: no step waits for it); a non-finite "
                             "loss stops the run at the read that sees it",
                             runtime=True, check=checks.at_least(1))
    eval_every: int = option(0, "also evaluate every N steps: `eval` lines in metrics.jsonl with the training "
                             "seconds so far (evaluations left out, checkpoints kept in), the bytes this rank sent "
                             "and, on the testbed, its link's bytes; 0: at epochs' ends only", runtime=True,
                             check=checks.at_least(0))
    time_budget: float = option(0.0, "stop training after this many seconds on that clock, evaluate and finish (a "
                                "time-to-quality comparison's budget); 0: train every epoch",
                                check=checks.within(0, 1e7))
    noise_scale: bool = option(False, "measure the gradient noise scale B_simple (McCandlish et al.): the batch "
                               "beyond which larger batches stop paying, from each worker's gradient and the "
                               "exchanged mean, in samples, per epoch in metrics.jsonl, summary.json and report.png "
                               "(needs 2+ workers)", runtime=True)

    @property
    def checkpoint_interval(self) -> tuple[int, float]:
        """(steps, seconds) between mid-epoch checkpoints; 0 where that kind is off."""
        number, minutes = EVERY.match(self.checkpoint_every).groups()
        return (0, float(number) * 60) if minutes else (int(float(number)), 0.0)
