import torch

from scalesgd.comm.wire.sparse import allgather_sparse, mean_of_sparse
from tests.spawn_util import run_workers

N = 1000


def rank_entries(rank):
    g = torch.Generator().manual_seed(rank)
    count = [0, 37, 400, 5][rank]  # different counts per rank, one rank sends nothing
    return torch.randperm(N, generator=g)[:count], torch.randn(count, generator=g)


def exchange(rank, world):
    idx, val = rank_entries(rank)
    gathered = allgather_sparse(idx, val)
    all_idx, all_val, sent = gathered.indices, gathered.values, gathered.sent
    out = torch.empty(N)
    mean_of_sparse(out, all_idx, all_val)
    return out, sent


def test_sparse_exchange_equals_a_dense_allreduce_of_the_masked_tensors():
    results = run_workers(exchange, 4)
    dense = torch.zeros(N)
    for r in range(4):
        idx, val = rank_entries(r)
        dense.index_add_(0, idx, val)
    dense /= 4
    for out, _ in results:
        assert torch.equal(out, results[0][0])
        assert torch.allclose(out, dense, atol=1e-7)
    # each rank forwards the 3 other ranks' pieces once round the ring: indices (8 B) + values (4 B)
    total = sum(len(rank_entries(r)[0]) for r in range(4))
    for rank, (_, sent) in enumerate(results):
        own_next = total - len(rank_entries((rank + 1) % 4)[0])  # everything but what the right neighbour has
        assert sent == own_next * 12 + 3 * 24  # and its (lengths of both parts, flag) to each of the 3 others
