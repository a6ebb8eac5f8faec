"""lowrank's two products on vgg16's 16 gradient matrices at rank 4, Q kept as cols × rank (PyTorch's hook, and
our codec before) against rank × cols (ours now): `python docs/benchmarks/lowrank-products/products.py`.

Prints ms a step summed over the matrices, the median of 9 calls each, for 3 rounds, on 2 threads (a testbed
process's share of this machine)."""

import statistics
import time

import torch

from scalesgd.models.vgg import vgg16


def median_ms(call, calls: int = 9) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(rank: int = 4, rounds: int = 3) -> None:
    torch.set_num_threads(2)
    shapes = [(p.shape[0], p[0].numel()) for p in vgg16().parameters() if p.dim() >= 2]
    for r in range(rounds):
        total = dict.fromkeys(("Mt·P (Q as cols×r)", "Pt·M (Q as r×cols)", "M·Q (Q as cols×r)", "M·Q (Q as r×cols)"),
                              0.0)
        for rows, cols in shapes:
            m, p = torch.randn(rows, cols), torch.randn(rows, rank)
            q, qt = torch.randn(cols, rank), torch.randn(rank, cols)
            for name, call in zip(total, (lambda: torch.mm(m.t(), p, out=q), lambda: torch.mm(p.t(), m, out=qt),
                                          lambda: torch.mm(m, q, out=p), lambda: torch.mm(m, qt.t(), out=p))):
                total[name] += median_ms(call)
        print(f"round {r + 1}: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in total.items()))


if __name__ == "__main__":
    main()
