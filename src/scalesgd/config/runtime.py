"""`scalesgd train`'s runtime options: how many workers, where they meet, how long a collective may wait, how
often a lost group restarts, the threads each computes with. None changes what a run computes but `workers`."""

from __future__ import annotations

from dataclasses import dataclass

from scalesgd import checks
from scalesgd.options import option


@dataclass
class RuntimeConfig:
    """Where and how a run's workers execute."""

    workers: int = option(2, "local worker processes; under torchrun the launch decides", check=checks.local_workers)
    timeout: float = option(300.0, "seconds any collective may wait", runtime=True, check=checks.timeout)
    max_restarts: int = option(0, "a failed worker group (a worker lost, not bad input or divergence) starts again "
                               "from the last checkpoint, this many times at most; under torchrun give torchrun's "
                               "own --max-restarts and a --run-dir", runtime=True, check=checks.at_least(0))
    master_addr: str = option("127.0.0.1", "rendezvous address", runtime=True, check=checks.master_addr)
    master_port: int = option(0, "rendezvous port", shown_default="a free one", runtime=True,
                              check=checks.within(0, 65535, note="0 picks a free port"))
    threads: int = option(0, "compute threads per worker", shown_default="cores / workers", runtime=True,
                          check=checks.threads(0, "0 picks cores / local workers"))
