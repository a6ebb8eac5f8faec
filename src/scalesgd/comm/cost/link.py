"""A link's α (seconds per message) and β (bytes per second), measured between two ranks of a process group.

α is half the round trip of a one-element message; the rate is that of a payload sent both ways at
once with paired isend/irecv, as every step of our collectives does. Both are what torch.distributed
gives, its per-message overheads included, not what the wire could do.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

PINGS = 20


@dataclass(frozen=True)
class LinkCost:
    """A message of n bytes takes `alpha_s + n / bytes_per_s` seconds."""

    alpha_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float, messages: float = 1.0) -> float:
        return messages * self.alpha_s + nbytes / self.bytes_per_s

    def to_dict(self) -> dict:
        return {"alpha_s": self.alpha_s, "bytes_per_s": self.bytes_per_s}

    @classmethod
    def from_dict(cls, d: dict) -> LinkCost:
        return cls(float(d["alpha_s"]), float(d["bytes_per_s"]))


def measure(a: int, b: int, megabytes: float = 8.0, repeats: int = 3, group=None) -> LinkCost:
    """The link between global ranks `a` and `b` (collective: every rank of `group` calls it; the others wait)."""
    rank = dist.get_rank()
    payload = torch.ones(max(1, int(megabytes * (1 << 20)) // 4))
    inbox, tick = torch.empty_like(payload), torch.zeros(1)
    pings, duplex = [], []
    other = b if rank == a else a
    for _ in range(repeats):
        dist.barrier(group=group)
        if rank in (a, b):
            pings.append(statistics.median(round_trip(rank == a, other, tick, tick, tick) for _ in range(PINGS)))
            duplex.append(both_ways(other, payload, inbox))
    result = torch.zeros(2, dtype=torch.float64)
    if rank == a:
        alpha = statistics.median(pings) / 2
        result[:] = torch.tensor([alpha, payload.numel() * 4 / max(statistics.median(duplex) - alpha, 1e-9)])
    dist.broadcast(result, a, group=group)
    return LinkCost(*result.tolist())


def round_trip(first: bool, other: int, send: torch.Tensor, into: torch.Tensor, reply: torch.Tensor) -> float:
    """The first rank sends `send` and waits for `reply`; the other receives into `into` and answers: seconds."""
    start = time.perf_counter()
    if first:
        dist.send(send, other)
        dist.recv(reply, other)
    else:
        dist.recv(into, other)
        dist.send(reply, other)
    return time.perf_counter() - start


def both_ways(other: int, payload: torch.Tensor, inbox: torch.Tensor) -> float:
    """Both ranks send `payload` at once (paired isend/irecv): seconds until both directions are done."""
    start = time.perf_counter()
    works = [dist.irecv(inbox, other), dist.isend(payload, other)]
    for work in works:
        work.wait()
    return time.perf_counter() - start


def measure_topology(world_size: int, procs_per_node: int, group=None) -> dict:
    """`{"inter": LinkCost | None, "intra": LinkCost | None}`: rank 0 to the next node's first rank, and to
    its neighbour on the same node (collective)."""
    nodes = world_size // procs_per_node
    return {"inter": measure(0, procs_per_node, group=group) if nodes > 1 else None,
            "intra": measure(0, 1, group=group) if procs_per_node > 1 else None}
