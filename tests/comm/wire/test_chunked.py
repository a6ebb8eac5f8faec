"""The chunked two-bit wire: each chunk's largest entries, largest first, at one of four values a chunk; every
message decodes to exactly what `quantize` gave, in `message_bytes`, about 1.7 bytes an entry at the defaults."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.comm.wire.chunked import ChunkWire


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5000), st.integers(2, 700), st.integers(1, 80), st.integers(0, 2 ** 31))
def test_each_chunk_sends_its_largest_entries_at_two_levels_and_decodes_bit_for_bit(numel, chunk, top, seed):
    wire = ChunkWire(chunk, top)
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(numel, generator=g) * 10.0 ** torch.randint(-4, 3, (numel,), generator=g)
    idx = wire.select(v)
    counts = wire.counts(numel)
    assert idx.numel() == int(counts.sum()) and len(set(idx.tolist())) == idx.numel()
    start = 0
    for c, k in enumerate(counts.tolist()):
        mine = idx[start:start + k]
        assert torch.all(mine // chunk == c)  # chunk by chunk
        magnitude = v[mine].abs()
        assert torch.all(magnitude[:-1] >= magnitude[1:])  # largest first
        rest = torch.ones(min(chunk, numel - c * chunk), dtype=torch.bool)
        rest[mine - c * chunk] = False
        if rest.any():
            assert magnitude.min() >= v[c * chunk:(c + 1) * chunk][rest].abs().max()  # none left is larger
        start += k
    sent = wire.quantize(v[idx], numel)
    travels = sent != 0  # a level below fp16's smallest is 0, whatever its sign
    assert torch.all((sent[travels] > 0) == (v[idx][travels] >= 0))  # the sign travels
    start = 0
    for k in counts.tolist():
        levels = sent[start:start + k].abs()
        hi = (k + 1) // 2
        assert levels[:hi].unique().numel() == 1 and levels[hi:].unique().numel() <= 1  # two magnitudes a chunk
        torch.testing.assert_close(levels[0], v[idx][start:start + hi].abs().mean().half().float().clamp(max=65504))
        start += k
    (message,) = wire.encode(idx, sent, numel)
    assert message.dtype == torch.uint8 and message.numel() == wire.message_bytes(numel)
    back_idx, back_values = wire.decode((message,), numel)
    assert torch.equal(back_idx, idx) and torch.equal(back_values, sent)


def test_at_the_defaults_an_entry_costs_under_1_7_bytes_against_the_compact_wires_4():
    wire = ChunkWire()
    assert (wire.chunk, wire.top, wire.offset_bits) == (4096, 64, 12)
    numel = 100 * 4096
    entries = 100 * 64
    assert wire.message_bytes(numel) == 100 * 4 + entries * 12 // 8 + entries // 8  # levels, offsets, signs
    assert wire.message_bytes(numel) / entries == wire.entry_bytes() < 1.7


def test_a_top_of_the_chunk_or_more_sends_every_entry():
    wire = ChunkWire(8, 20)
    v = torch.arange(-10.0, 10.0)
    assert sorted(wire.select(v).tolist()) == list(range(20))


def test_no_entries_travel_as_an_empty_message():
    wire = ChunkWire(16, 4)
    (message,) = wire.encode(torch.zeros(0, dtype=torch.int32), torch.zeros(0), 100)
    idx, values = wire.decode((message,), 100)
    assert message.numel() == 0 and idx.numel() == 0 and values.numel() == 0
