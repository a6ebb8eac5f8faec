"""Several collectives in flight at once, so one piece's arithmetic runs while others' bytes are on the wire.

A bucket cut into pieces becomes one job per piece: encode it, sum it (its collective's steps), decode it.
The driver keeps up to `depth` jobs started and always resumes the job whose posted step is the oldest,
so the link always has the steps posted after it to carry while this process adds, encodes or decodes.
Every rank runs the same jobs with the same policy, which depends on nothing measured, so each pair of
peers posts its messages in the same order; tags keep the pieces apart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterable

PIECE_BYTES = 4 << 20  # bytes on the wire per piece of a bucket: ~34 ms at 1 Gbit/s, a few kernel calls each
DEPTH = 3  # pieces in flight: the link carries two while this process encodes, adds or decodes a third
TAGS = 1024  # message tags the pieces cycle through (far more than are ever in flight)

Steps = Generator[list, None, int]
"""A collective as steps: it yields the works it posted, is resumed once they are done, returns bytes sent.

Written once as steps (`scalesgd.comm.wire.collectives`), a collective runs blocking (`run_steps`) or interleaved
with others (`run_pipelined`), which is how encoding, transfers and decoding of different pieces of a bucket
overlap.
"""


def run_pipelined(jobs: Iterable[Steps], depth: int = 2) -> int:
    """Run `jobs` (step generators) with up to `depth` started at once; return the total bytes sent."""
    if depth < 1:
        raise ValueError(f"pipeline depth {depth}: give at least 1")
    pending = iter(jobs)
    posted: deque = deque()  # (job, the works it waits for), in the order they were posted
    sent = 0
    while True:
        job = next(pending, None) if len(posted) < depth else None
        if job is not None:
            sent += _advance(job, posted, first=True)
            continue
        if not posted:
            return sent
        job, works = posted.popleft()
        for work in works:
            work.wait()
        sent += _advance(job, posted)


def _advance(job: Steps, posted: deque, first: bool = False) -> int:
    """Run `job` to its next posted step (queued last in `posted`) or to its end (returning its bytes)."""
    try:
        works = next(job) if first else job.send(None)
    except StopIteration as done:
        return done.value or 0
    posted.append((job, works))
    return 0


def run_steps(steps: Steps):
    """Run one collective's steps one after another; return what it returns (its bytes sent, for a sum)."""
    try:
        works = next(steps)
        while True:
            for work in works:
                work.wait()
            works = steps.send(None)
    except StopIteration as done:
        return 0 if done.value is None else done.value
