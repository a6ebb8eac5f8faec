"""What every multi-worker benchmark shares: its launch options, and starting its workers or joining torchrun's."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from scalesgd import checks
from scalesgd.errors import UsageError
from scalesgd.options import Options, option, refuse
from scalesgd.runtime import launcher, process_group


@dataclass
class BenchLaunch(Options):
    """Where a benchmark's workers run and where rank 0 writes; the first options of every multi-worker bench."""

    procs_per_node: int = option(0, "processes per node for hierarchical", shown_default="LOCAL_WORLD_SIZE",
                                 check=checks.at_least(0, "0 reads LOCAL_WORLD_SIZE"))
    out: str = option("", "output directory", shown_default="runs/bench/<kind>-<timestamp>", check=checks.output_dir)
    timeout: float = option(300.0, "seconds any collective may wait", check=checks.timeout)
    master_addr: str = option("127.0.0.1", "rendezvous address", check=checks.master_addr)
    master_port: int = option(0, "rendezvous port", shown_default="a free one",
                              check=checks.within(0, 65535, note="0 picks a free port"))
    threads: int = option(0, "compute threads per worker", shown_default="cores / workers",
                          check=checks.threads(0, "0 picks cores / local workers"))

    def check_launch(self, workers: int) -> None:
        if self.procs_per_node and workers % self.procs_per_node:
            raise UsageError(f"`procs_per_node` {self.procs_per_node}: must divide `workers` {workers}")
        refuse("master_port", self.master_port, checks.master_port(self.master_addr, self.master_port))

    def check_memory(self, workers: int, name: str, per_worker: int, what: str, instead: str) -> None:
        """`per_worker` bytes (`what` they hold) in every worker started here must be free now: refused naming
        option `name`, and what to give `instead`."""
        copies = checks.processes_here(workers)
        problem = checks.fits_in_memory(per_worker * copies)
        refuse(name, getattr(self, name), problem and f"{what} in each of {copies} worker(s): {problem}; {instead}")

    def node_size(self, workers: int) -> int:
        """Processes per node: the option, else what the launcher says."""
        return self.procs_per_node or process_group.local_world_size(workers)


def default_out(kind: str) -> str:
    return f"runs/bench/{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def in_process(kind: str, run: Callable[..., int], cfg, argv: list[str]) -> int:
    """A command that runs in this process (it may start runs of its own), writing to runs/bench/<kind>-… by
    default."""
    cfg.out = cfg.out or default_out(kind)
    return run(cfg, command_line(argv))


def on_workers(kind: str, run: Callable[..., int], cfg, argv: list[str]) -> int:
    """Join torchrun's launch, or start `cfg.workers` local workers that each run this same command."""
    if process_group.launched_by_torchrun():
        cfg.workers = int(os.environ["WORLD_SIZE"])
        cfg.out = cfg.out or f"runs/bench/{kind}-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
        try:
            return run(cfg, command_line(argv))
        except Exception as err:
            if not process_group.is_peer_failure(err):
                raise
            return process_group.peer_lost(err)  # the launcher names the worker that failed
    refuse("workers", cfg.workers, checks.gpus_problem(cfg.workers))
    if not cfg.out:  # every worker must write to the directory the parent chose
        cfg.out = default_out(kind)
        argv = [*argv, "--out", cfg.out]
    return launcher.spawn(["-m", "scalesgd", *argv], cfg.workers, cfg.master_addr, cfg.master_port, cfg.timeout)


def command_line(argv: list[str]) -> str:
    return "scalesgd " + " ".join(argv)
