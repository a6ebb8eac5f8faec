"""The compact sparse wire: indices as 16-bit offsets in blocks or as a bitmap, whichever is smaller, and fp16
values; every message decodes to exactly the entries encoded, and costs at most 4 bytes an entry."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.comm.wire.compact import BLOCK, COMPACT, HEADER, compact_size
from scalesgd.comm.wire.sparse import allgather_sparse, mean_of_sparse
from tests.spawn_util import run_workers


def entries(numel: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`k` distinct indices of `numel` in random order, with fp16-representable values (zero and extremes too)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(numel, generator=g)[:k].to(torch.int32)
    values = (torch.randn(k, generator=g) * 10.0 ** torch.randint(-6, 4, (k,), generator=g)).half().float()
    if k >= 3:
        values[:3] = torch.tensor([0.0, 65504.0, -2.0 ** -24])
    return idx, values


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3 * BLOCK + 17), st.floats(0, 1), st.integers(0, 2 ** 31))
def test_a_message_decodes_to_exactly_the_entries_it_was_given(numel, density, seed):
    k = int(density * min(numel, 4000))
    idx, values = entries(numel, k, seed)
    (message,) = COMPACT.encode(idx, values, numel)
    assert message.dtype == torch.uint8 and message.numel() == compact_size(k, numel)
    back_idx, back_values = COMPACT.decode((message,), numel)
    order = torch.argsort(idx.long())
    assert torch.equal(back_idx, idx.long()[order])  # the same entries, sorted
    assert torch.equal(back_values, values[order])  # bit for bit: fp16 held them exactly


def test_the_smaller_index_form_is_chosen_and_an_entry_costs_at_most_4_bytes():
    numel = 10 * BLOCK
    sparse, dense = compact_size(1000, numel), compact_size(numel // 4, numel)
    assert sparse == HEADER + 4 * 10 + 2 * 1000 + 2 * 1000  # blocks: 2 + 2 bytes an entry, a count per block
    assert dense == HEADER + numel // 8 + 2 * (numel // 4)  # a bitmap: 1 bit an element
    for k in (1000, 10_000, numel // 64, numel // 4):
        assert compact_size(k, numel) <= 4 * k + HEADER + 4 * 10


def gathered(rank, world):
    numel = BLOCK + 999
    idx, values = entries(numel, [0, 300, 5000][rank], rank)
    plain = allgather_sparse(idx, values)
    compact = allgather_sparse(idx, values, wire=COMPACT, numel=numel)
    means = []
    for g in (plain, compact):
        out = torch.empty(numel)
        mean_of_sparse(out, g.indices, g.values)
        means.append(out)
    return means, plain.sent, compact.sent


def test_through_the_ring_the_compact_wire_gives_the_plain_ones_mean_in_fewer_bytes():
    results = run_workers(gathered, 3)
    for (plain, compact), plain_sent, compact_sent in results:
        assert torch.equal(plain, compact) and torch.equal(compact, results[0][0][1])
        assert compact_sent < 0.6 * plain_sent
