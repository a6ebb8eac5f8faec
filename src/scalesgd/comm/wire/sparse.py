"""The sparse exchange: every rank's (indices, values) to every rank, then the dense mean.

Counts travel first (they differ between ranks); then the variable-size pieces go around a ring of
paired send/receive steps, which use the link both ways at once (gloo's own all_gather does not:
measured, it takes twice the full-duplex time). The pieces are the entries as a `SparseWire` encodes them
(`scalesgd.comm.wire.compact`: plain, or compact at ≤ 4 bytes an entry); the receiver decodes them.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalesgd.comm.wire.collectives import post, ring_members
from scalesgd.comm.wire.compact import PLAIN, SparseWire
from scalesgd.comm.wire.pipeline import run_steps


@dataclass
class Gathered:
    """Every rank's indices and values in rank order, the bytes this rank sent, and whether any rank raised its flag."""

    indices: list[torch.Tensor]
    values: list[torch.Tensor]
    sent: int
    flagged: bool


def allgather_sparse_steps(indices: torch.Tensor, values: torch.Tensor, group=None, flag: bool = False,
                           tag: int = 0, wire: SparseWire = PLAIN, numel: int = 0) -> Generator[list, None, Gathered]:
    """`allgather_sparse` as steps (see `scalesgd.comm.wire.pipeline`), returning what it gathered."""
    rank, peers = ring_members(group)
    p = len(peers)
    parts = wire.encode(indices, values, numel)
    count = torch.tensor([*(part.numel() for part in parts), int(flag)], dtype=torch.int64, device=indices.device)
    counts = [torch.empty_like(count) for _ in range(p)]
    yield [dist.all_gather(counts, count, group=group, async_op=True)]  # a few small integers: latency only
    gathered = torch.stack(counts).tolist()
    empty = wire.like(indices, values)
    everyone = [parts if r == rank else tuple(e.new_empty(n) for e, n in zip(empty, gathered[r][:-1]))
                for r in range(p)]
    right, left = peers[(rank + 1) % p], peers[(rank - 1) % p]
    sent = count.numel() * count.element_size() * (p - 1)
    for step in range(p - 1):  # pass what arrived last step on to the right
        out, into = (rank - step) % p, (rank - step - 1) % p
        for j in range(len(parts)):
            works, nbytes = post(group, everyone[out][j], right, everyone[into][j], left, tag)
            yield works
            sent += nbytes
    decoded = [wire.decode(everyone[r], numel) for r in range(p)]  # this rank's too: every rank sums the same
    return Gathered([d[0] for d in decoded], [d[1] for d in decoded], sent, any(c[-1] for c in gathered))


def allgather_sparse(indices: torch.Tensor, values: torch.Tensor, group=None, flag: bool = False,
                     wire: SparseWire = PLAIN, numel: int = 0) -> Gathered:
    """Every rank's `indices` and `values` (same length per rank, any length across ranks), in rank order, the
    bytes this rank sent, and whether any rank raised its `flag` (it travels with the counts). `wire` says how
    they travel; the compact one needs the bucket's length `numel` (the same on every rank)."""
    return run_steps(allgather_sparse_steps(indices, values, group, flag, wire=wire, numel=numel))


def mean_of_sparse(out: torch.Tensor, all_idx: list[torch.Tensor], all_val: list[torch.Tensor]) -> None:
    """out ← Σ_r scatter(all_idx[r], all_val[r]) ÷ ranks, accumulated in rank order (same bits everywhere)."""
    out.zero_()
    for idx, val in zip(all_idx, all_val):
        out.index_add_(0, idx, val)
    out.div_(len(all_idx))
