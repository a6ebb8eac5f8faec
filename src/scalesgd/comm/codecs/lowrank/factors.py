"""A bucket cut for low-rank compression, and the batched orthogonalisation of its factors.

Each parameter's gradient is viewed as a matrix, its first dimension by the rest (a convolution's out-channels by
in-channels·kernel), as Vogels et al. 2019 ("PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization") and PyTorch's hook do. A matrix n×m is compressed at rank r = min(n, m, rank) when its factors are
at least `min_rate` times smaller than it, (n + m)·r·min_rate < n·m; the rest (biases, norms, small matrices) travel
uncompressed beside the factors in the same message. Factors of the same shape sit side by side, so each shape's
factors are orthogonalised in one batched call. Q is kept transposed (rank × cols, row-major), so both products read
the gradient along its rows: on the CPU Qᵀ = P̂ᵀ·M takes less than half the time of Mᵀ·P̂, a strided read of M
(docs/results.md, low-rank speed).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Matrix:
    """One compressed parameter: its place in the bucket, its matrix shape and rank, and where its factors sit."""

    key: int  # the parameter's number (its state's key)
    start: int  # offset in the bucket
    rows: int
    cols: int
    rank: int
    p_at: int  # offset of its P (rows × rank) in the P buffer
    q_at: int  # offset of its Qᵀ (rank × cols) in the Q buffer

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    def p(self, buffer: torch.Tensor) -> torch.Tensor:
        """Its P (rows × rank), a view of the P buffer."""
        return buffer[self.p_at:self.p_at + self.rows * self.rank].view(self.rows, self.rank)

    def qt(self, buffer: torch.Tensor) -> torch.Tensor:
        """Its Q transposed (rank × cols), a view of the Q buffer."""
        return buffer[self.q_at:self.q_at + self.cols * self.rank].view(self.rank, self.cols)


@dataclass(frozen=True)
class Layout:
    """A bucket's compressed matrices (grouped by shape), the (offset, length) runs it sends uncompressed, and the
    lengths of its P and Q buffers."""

    matrices: tuple[Matrix, ...]
    dense: tuple[tuple[int, int], ...]
    p_numel: int
    q_numel: int
    # (key, offset in the bucket, size, offset among the uncompressed numbers of the message) of each parameter sent
    # uncompressed: the merged runs follow one another in the bucket's order
    uncompressed: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def dense_numel(self) -> int:
        return sum(n for _, n in self.dense)

    def groups(self) -> list[tuple[Matrix, ...]]:
        """The matrices by shape, each group's factors adjacent in the P and Q buffers."""
        by_shape: dict[tuple[int, int, int], list[Matrix]] = defaultdict(list)
        for m in self.matrices:
            by_shape[(m.rows, m.cols, m.rank)].append(m)
        return [tuple(group) for group in by_shape.values()]


def compresses(rows: int, cols: int, rank: int, min_rate: float) -> bool:
    """Whether a rows×cols matrix is worth factoring at `rank`: its factors `min_rate` times smaller (PyTorch's
    rule)."""
    r = min(rows, cols, rank)
    return (rows + cols) * r * min_rate < rows * cols


def sent_elements(shape, rank: int, min_rate: float, alternate: bool = False) -> float:
    """The numbers a tensor of `shape` puts on the wire a step: its two factors (one a step, alternating: the mean of
    P's and Q's), or itself where it is not factored. What the simulator costs the low-rank codecs by."""
    size = math.prod(shape)
    rows = shape[0] if len(shape) >= 2 else 0
    cols = size // rows if rows else 0
    if not (rows and compresses(rows, cols, rank, min_rate)):
        return float(size)
    factors = (rows + cols) * min(rows, cols, rank)
    return factors / 2 if alternate else float(factors)


def layout(keys, offsets, shapes, numel: int, rank: int, min_rate: float) -> Layout:
    """The layout of a bucket of parameters with these numbers, offsets and shapes (`numel` elements in all; a bucket
    without parameters is sent uncompressed)."""
    chosen, dense, uncompressed = [], [], []
    for key, start, shape in zip(keys, offsets, shapes):
        size = 1
        for d in shape:
            size *= d
        rows = shape[0] if len(shape) >= 2 else 0
        cols = size // rows if rows else 0
        if rows and compresses(rows, cols, rank, min_rate):
            chosen.append((key, start, rows, cols, min(rows, cols, rank)))
        elif size:
            dense.append((start, size))
            uncompressed.append((key, start, size))
    at = 0
    for i, (key, start, size) in enumerate(sorted(uncompressed, key=lambda u: u[1])):
        uncompressed[i], at = (key, start, size, at), at + size
    if not keys and numel:
        dense.append((0, numel))
    by_shape: dict[tuple[int, int, int], list] = defaultdict(list)
    for c in chosen:
        by_shape[c[2:]].append(c)
    matrices, p_at, q_at = [], 0, 0
    for (rows, cols, r), group in by_shape.items():
        for key, start, *_ in group:
            matrices.append(Matrix(key, start, rows, cols, r, p_at, q_at))
            p_at, q_at = p_at + rows * r, q_at + cols * r
    return Layout(tuple(matrices), tuple(_merge(dense)), p_at, q_at, tuple(uncompressed))


def _merge(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent (offset, length) runs joined, so the uncompressed copies are few and long."""
    merged: list[list[int]] = []
    for start, size in sorted(runs):
        if merged and merged[-1][0] + merged[-1][1] == start:
            merged[-1][1] += size
        else:
            merged.append([start, size])
    return [(a, n) for a, n in merged]


def row_blocks(rows: int, cols: int, numbers: int | None) -> list[tuple[int, int]]:
    """(first, end) of consecutive blocks of a rows×cols matrix's rows, at most `numbers` numbers each (at least one
    row; None: the whole matrix in one block)."""
    step = rows if numbers is None else max(1, min(rows, numbers // cols))
    return [(a, min(a + step, rows)) for a in range(0, rows, step)]


def batched(buffer: torch.Tensor, group: tuple[Matrix, ...], which: str) -> torch.Tensor:
    """The group's P (`which` "p") or Q ("q") factors as B×n×rank, one view of `buffer` (a group's factors sit side by
    side; Q's a transposed view of its B×rank×cols)."""
    first = group[0].p(buffer) if which == "p" else group[0].qt(buffer)
    start = first.storage_offset() - buffer.storage_offset()
    stacked = buffer[start:start + len(group) * first.numel()].view(len(group), *first.shape)
    return stacked if which == "p" else stacked.transpose(1, 2)


def orthogonalize(matrices: torch.Tensor, eps: float = 1e-8) -> None:
    """Orthonormal columns for each matrix of a batch (B×n×r), in place: QR where the rank is above 2, Gram-Schmidt
    at ranks 1 and 2 and in 16-bit arithmetic (QR takes neither well), as PyTorch's PowerSGD hook chooses. A zero
    column stays finite (`eps`)."""
    rank = matrices.shape[2]
    if rank > 2 and matrices.dtype not in (torch.float16, torch.bfloat16):
        matrices.copy_(torch.linalg.qr(matrices).Q)
        return
    for i in range(rank):
        col = matrices[:, :, i:i + 1]
        col.div_(col.norm(dim=1, keepdim=True) + eps)
        if i + 1 < rank:
            rest = matrices[:, :, i + 1:]
            rest.sub_((col * rest).sum(dim=1, keepdim=True) * col)
