"""`scalesgd bench link`: throughput, round trip and α/β fit between the first process of node 0 and of node 1."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from scalesgd import checks, output
from scalesgd.bench.launch import BenchLaunch
from scalesgd.comm.cost.link import PINGS, LinkCost, both_ways, round_trip
from scalesgd.options import option
from scalesgd.runtime import process_group

LADDER = 4  # one-way times at the payload and at each quarter below it, this many sizes: the α/β fit's points


@dataclass
class LinkBenchConfig(BenchLaunch):
    """`scalesgd bench link`: throughput and round trip across the link between two nodes."""

    workers: int = option(2, "local workers; under torchrun the launch decides",
                          check=checks.all_of(checks.at_least(2, "a link needs at least 2"), checks.local_workers))
    megabytes: int = option(16, "payload of the largest transfer, MiB (quarters of it down to 1/64 are timed too, "
                            "for the α/β fit)", check=checks.positive)
    repeats: int = option(5, "timed transfers of each size; the figures are their median", check=checks.positive)

    def validate(self) -> LinkBenchConfig:
        super().validate()
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
        smaller = {n: [] for n in sorted({payload.numel() >> 2 * k for k in range(1, LADDER)} - {0})}
        for _ in range(cfg.repeats):
            dist.barrier()
            if me is not None:
                rtt.append(_ping(me, other, tick))
                one_way.append(round_trip(me == 0, other, payload, inbox, tick))  # acknowledged by one element
                duplex.append(both_ways(other, payload, inbox))
                for n, times in smaller.items():
                    times.append(round_trip(me == 0, other, payload[:n], inbox[:n], tick))
        if env.rank == 0:
            report(cfg, env.world_size, peer, payload.numel(), (rtt, one_way, duplex), smaller, command)
        process_group.finish()
        return 0
    finally:
        process_group.close()


def report(cfg: LinkBenchConfig, world: int, peer: int, numel: int, times: tuple[list, list, list],
           smaller: dict[int, list], command: str) -> None:
    """The table, link.json and link.md, and link.png: one-way time against message size with its α/β fit."""
    rtt, one_way, duplex = times
    r, o, d = statistics.median(rtt), statistics.median(one_way), statistics.median(duplex)
    bits = numel * 4 * 8
    points = [(4, r / 2), *((4 * n, statistics.median(t) - r / 2) for n, t in smaller.items()), (4 * numel, o - r / 2)]
    fit = fit_one_way(points)
    result = {"peer_rank": peer, "megabytes": cfg.megabytes, "rtt_ms": 1e3 * r,
              "one_way_mbit_s": _mbit_s(bits, o - r / 2), "duplex_mbit_s_each_way": bits / d / 1e6,
              # the fastest transfer: what the shaper lets through when nothing else slows us
              "best_one_way_mbit_s": _mbit_s(bits, min(one_way) - r / 2),
              "best_duplex_mbit_s_each_way": bits / min(duplex) / 1e6,
              "one_way": [{"bytes": b, "seconds": s} for b, s in points], "fit": fit.to_dict()}
    columns = ["between ranks", "round trip ms", "one way Mbit/s", "both ways at once, Mbit/s each",
               "fit α µs", "fit β Mbit/s"]
    rows = [[f"0 ↔ {peer}", f"{result['rtt_ms']:.3f}", f"{result['one_way_mbit_s'] or 0:.0f}",
             f"{result['duplex_mbit_s_each_way']:.0f}", f"{1e6 * fit.alpha_s:.1f}", f"{8 * fit.bytes_per_s / 1e6:.0f}"]]
    out = Path(cfg.out)
    output.write(out, "link", {"world_size": world, "config": cfg.to_dict(), "result": result}, columns, rows, command)
    plot(out / "link.png", peer, cfg.repeats, points, fit)
    output.console().print(output.rich_table(f"link, median of {cfg.repeats}", columns, rows))
    output.console().print(f"written to {out}/link.{{json,md,png}}", highlight=False)


def _mbit_s(bits: int, seconds: float) -> float | None:
    """A rate; None where the transfer took no longer than half a round trip (the payload is too small to time)."""
    return bits / seconds / 1e6 if seconds > 0 else None


def fit_one_way(points: list[tuple[int, float]]) -> LinkCost:
    """α: the one-element message's time (the first point); β: least squares of the others' time beyond α."""
    alpha = points[0][1]
    rest = points[1:]
    slope = sum(b * (s - alpha) for b, s in rest) / sum(b * b for b, _ in rest)
    return LinkCost(alpha, 1 / max(slope, 1e-15))  # a slope ≤ 0 (noise only) reads as a link no message waits on


def plot(path: Path, peer: int, repeats: int, points: list[tuple[int, float]], fit: LinkCost) -> None:
    """Measured one-way times and the fitted α + n/β, both axes logarithmic."""
    plt = output.pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    sizes = [b for b, _ in points]
    ax.plot(sizes, [1e3 * s for _, s in points], "o", label=f"measured, median of {repeats}")
    line = [sizes[0] * (sizes[-1] / sizes[0]) ** (i / 63) for i in range(64)]
    ax.plot(line, [1e3 * fit.seconds(b) for b in line], "-",
            label=f"fit α + n/β: α {1e6 * fit.alpha_s:.1f} µs, β {8 * fit.bytes_per_s / 1e6:.0f} Mbit/s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain = plt.FuncFormatter(lambda v, _: f"{v:g}")  # 0.1 and 2.5, not 10⁻¹ and 2.5×10⁰
    ax.yaxis.set_major_formatter(plain)
    low, high = ax.get_ylim()
    ax.yaxis.set_minor_formatter(plain if high < 10 * low else plt.NullFormatter())  # within a decade: label 2…9
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("one-way time (ms)")
    ax.set_title(f"bench link: one-way time of a message between ranks 0 and {peer}, against its size")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ping(me: int, other: int, tick: torch.Tensor) -> float:
    """Median round trip of a one-element message."""
    return statistics.median(round_trip(me == 0, other, tick, tick, tick) for _ in range(PINGS))
