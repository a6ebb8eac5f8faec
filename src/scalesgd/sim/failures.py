"""What failures cost a run, for `scalesgd simulate --mtbf-hours`: each of W workers fails on average once every MTBF,
each failure costs the whole run c seconds, so a run that needs T seconds without failures needs T / (1 − W·c/MTBF)
(failures keep coming while it runs longer) and never ends where W·c ≥ MTBF.

A periodic mode runs elastic rounds (`scalesgd train --elastic`): the survivors wait until the coordinator drops the
dead worker (`ELASTIC_FAULT_S`, measured), its half-done round is lost (half a round of one of W workers on average)
and the run trains without it until its restart is back (`restart_s` of one of W). Every other mode stops the world:
every worker waits for the restart and trains again what it did since the last checkpoint (half the interval on
average)."""

from __future__ import annotations

from dataclasses import dataclass

# kill between rounds → the survivors' next round without it, 4 workers on loopback (docs/RELIABILITY.md#elastic-rounds:
# the lighthouse's 1 s join window and the round)
ELASTIC_FAULT_S = 1.1


@dataclass(frozen=True)
class Failures:
    """A cluster's failures: each worker's mean time between them, and what a restart and a checkpoint take."""

    mtbf_s: float  # one worker's mean seconds between failures
    restart_s: float  # a restarted worker (or every worker, stopping the world) back in training
    checkpoint_s: float  # seconds of training between checkpoints (a stop-the-world restart trains half again)

    def per_failure_s(self, workers: int, round_s: float | None) -> float:
        """Seconds of the whole run one failure costs: elastic rounds of `round_s` (a periodic mode), else a restart
        of every worker from the last checkpoint (`round_s` None)."""
        if round_s is None:
            return self.restart_s + self.checkpoint_s / 2
        return ELASTIC_FAULT_S + (round_s / 2 + self.restart_s) / workers

    def stretched(self, seconds: float | None, workers: int, per_failure_s: float) -> float | None:
        """`seconds` of a run without failures, with them; None where it never ends (or `seconds` is None)."""
        lost = workers * per_failure_s / self.mtbf_s  # the share of the run's time failures take
        return None if seconds is None or lost >= 1 else seconds / (1 - lost)
