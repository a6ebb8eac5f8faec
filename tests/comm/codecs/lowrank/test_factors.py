"""A bucket's low-rank layout (which tensors are factored, grouped by shape) and the batched orthogonalisation."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.comm.codecs.lowrank.factors import compresses, layout, orthogonalize, row_blocks


def test_matrices_worth_factoring_are_grouped_by_shape_and_the_rest_sent_in_merged_runs():
    shapes = [(32, 16), (4,), (32, 16), (12, 3, 3, 3), (2, 2), (8,)]
    sizes = [512, 4, 512, 324, 4, 8]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    plan = layout(tuple(range(6)), offsets, shapes, sum(sizes), rank=4, min_rate=2.0)
    assert [(m.key, m.rows, m.cols, m.rank) for m in plan.matrices] == [(0, 32, 16, 4), (2, 32, 16, 4), (3, 12, 27, 4)]
    assert plan.dense == ((512, 4), (1352, 12))  # the bias, and the 2×2 matrix beside the last vector: one run
    first, second, conv = plan.matrices
    assert (second.p_at, second.q_at) == (first.p_at + 32 * 4, first.q_at + 16 * 4)  # same shape: side by side
    assert (conv.p_at, conv.q_at) == (2 * 32 * 4, 2 * 16 * 4)
    assert (plan.p_numel, plan.q_numel) == (32 * 4 * 2 + 12 * 4, 16 * 4 * 2 + 27 * 4)
    assert [len(g) for g in plan.groups()] == [2, 1]


def test_pytorchs_rule_factors_a_matrix_when_its_factors_are_min_rate_times_smaller():
    assert compresses(16, 8, 4, 2.0) is False  # (16 + 8)·4·2 = 192 ≥ 128
    assert compresses(16, 8, 1, 2.0) is True  # 48 < 128
    assert compresses(64, 64, 4, 2.0) is True
    assert compresses(3, 1000, 4, 2.0) is False  # rank 3 at most: 1003·3·2 > 3000


def test_a_bucket_without_parameters_is_sent_uncompressed():
    plan = layout((), [], [], 10, rank=4, min_rate=2.0)
    assert plan.matrices == () and plan.dense == ((0, 10),)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 50), st.integers(1, 50), st.one_of(st.none(), st.integers(1, 3000)))
def test_row_blocks_cover_every_row_once_in_order_each_within_its_numbers(rows, cols, numbers):
    blocks = row_blocks(rows, cols, numbers)
    assert blocks[0][0] == 0 and blocks[-1][1] == rows
    assert all(end == start for (_, end), (start, _) in zip(blocks, blocks[1:]))
    assert all(b - a >= 1 and ((b - a) * cols <= numbers or b - a == 1) for a, b in blocks) if numbers else \
        blocks == [(0, rows)]
    assert len(blocks) == (1 if numbers is None else -(-rows // max(1, min(rows, numbers // cols))))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(6, 40), st.sampled_from([torch.float32, torch.float64]),
       st.integers(0, 2 ** 31))
def test_orthogonalised_factors_have_orthonormal_columns_spanning_the_same_space(batch, rank, rows, dtype, seed):
    x = torch.randn(batch, rows, rank, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    q = x.clone()
    orthogonalize(q)
    eye = torch.eye(rank, dtype=dtype).expand(batch, rank, rank)
    assert torch.allclose(q.transpose(1, 2) @ q, eye, atol=1e-4)
    assert torch.allclose(q @ (q.transpose(1, 2) @ x), x, atol=1e-3)  # x lies in the span of q's columns


def test_a_zero_factor_stays_finite():
    for rank in (1, 2, 4):
        q = torch.zeros(2, 5, rank)
        orthogonalize(q)
        assert torch.isfinite(q).all()
