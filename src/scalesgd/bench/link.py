"""`scalesgd bench link`: throughput and round trip between the first process of node 0 and of node 1."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console

from scalesgd import checks, output
from scalesgd.bench.launch import BenchLaunch
from scalesgd.comm.link import PINGS, both_ways, round_trip
from scalesgd.options import check_fields, option
from scalesgd.runtime import process_group


@dataclass
class LinkBenchConfig(BenchLaunch):
    """`scalesgd bench link`: throughput and round trip across the link between two nodes."""

    workers: int = option(2, "local workers; under torchrun the launch decides",
                          check=checks.all_of(checks.at_least(2, "a link needs at least 2"), checks.local_workers))
    megabytes: int = option(16, "payload per transfer", check=checks.positive)
    repeats: int = option(5, "timed transfers", check=checks.positive)

    def validate(self) -> LinkBenchConfig:
        check_fields(self)
        self.check_launch(self.workers)
        return self


def run(cfg: LinkBenchConfig, command: str) -> int:
    """Rank 0 and the first rank of the next node measure; every other rank only takes part in barriers."""
    env = process_group.init(cfg.timeout, cfg.threads)
    try:
        peer = env.local_world_size if env.world_size > env.local_world_size else 1
        if env.world_size < 2:
            raise ValueError("bench link needs at least 2 processes (2 nodes for a link)")
        me = 0 if env.rank == 0 else 1 if env.rank == peer else None
        other = peer if me == 0 else 0
        payload = torch.ones(cfg.megabytes * (1 << 20) // 4)
        inbox, tick = torch.empty_like(payload), torch.zeros(1)
        rtt, one_way, duplex = [], [], []
        for _ in range(cfg.repeats):
            dist.barrier()
            if me is not None:
                rtt.append(_ping(me, other, tick))
                one_way.append(round_trip(me == 0, other, payload, inbox, tick))  # acknowledged by one element
                duplex.append(both_ways(other, payload, inbox))
        if env.rank == 0:
            r, o, d = statistics.median(rtt), statistics.median(one_way), statistics.median(duplex)
            bits = payload.numel() * 4 * 8
            result = {"peer_rank": peer, "megabytes": cfg.megabytes, "rtt_ms": 1e3 * r,
                      "one_way_mbit_s": bits / (o - r / 2) / 1e6, "duplex_mbit_s_each_way": bits / d / 1e6,
                      # the fastest transfer: what the shaper lets through when nothing else slows us
                      "best_one_way_mbit_s": bits / (min(one_way) - r / 2) / 1e6,
                      "best_duplex_mbit_s_each_way": bits / min(duplex) / 1e6}
            columns = ["between ranks", "round trip ms", "one way Mbit/s", "both ways at once, Mbit/s each"]
            rows = [[f"0 ↔ {peer}", f"{result['rtt_ms']:.3f}", f"{result['one_way_mbit_s']:.0f}",
                     f"{result['duplex_mbit_s_each_way']:.0f}"]]
            output.write(Path(cfg.out), "link", {"world_size": env.world_size, "config": cfg.to_dict(),
                                                 "result": result}, columns, rows, command)
            Console().print(output.rich_table(f"link, median of {cfg.repeats}", columns, rows))
        process_group.finish()
        return 0
    finally:
        process_group.close()


def _ping(me: int, other: int, tick: torch.Tensor) -> float:
    """Median round trip of a one-element message."""
    return statistics.median(round_trip(me == 0, other, tick, tick, tick) for _ in range(PINGS))
