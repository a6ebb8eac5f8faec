"""Each step's times as the loop measures them, and their summary for summary.json."""

from __future__ import annotations

import statistics

from scalesgd.comm.engine.optimizer import IterationStats


def iteration_timing(stats: IterationStats | None, waited: float, start: float, backward_end: float,
                     end: float) -> dict:
    """One iteration's times (from when it asked for its batch: the wait for data is part of the step), and how
    much of the exchange was hidden where the engine measures it."""
    timing = {"iteration_s": end - waited, "data_wait_s": start - waited, "compute_s": backward_end - start}
    if stats is not None:
        timing.update(codec_s=stats.codec_s, comm_s=stats.comm_s, exposed_comm_s=stats.exposed_s,
                      overlapped_comm_s=stats.overlapped_s, bytes_sent=stats.bytes_sent)
    return timing


def breakdown(timings: list[dict]) -> dict:
    """Median iteration time and wait for data (a few slow first batches make the mean wait say little of a step),
    and the mean of each part, for summary.json (a codec counter over the iterations that
    have it: none while the exchange is still dense)."""
    if not timings:
        return {}
    out = {"iterations": len(timings), "median_iteration_s": statistics.median(t["iteration_s"] for t in timings),
           "median_data_wait_s": statistics.median(t["data_wait_s"] for t in timings)}
    for key in dict.fromkeys(k for t in timings for k in t):
        out[f"mean_{key}"] = statistics.fmean(t[key] for t in timings if key in t)
    return out
