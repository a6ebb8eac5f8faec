"""GlobalBatchSampler: every sample exactly once per epoch, equal step counts, no tiny rank batches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Sampler, TensorDataset

from scalesgd.data import GlobalBatchSampler


def epoch_batches(num_samples, global_batch, world_size, seed=0, epoch=0, min_per_rank=2):
    """All ranks' batches for one epoch: result[rank][step] is a list of indices."""
    per_rank = []
    for rank in range(world_size):
        sampler = GlobalBatchSampler(num_samples, global_batch, world_size, rank, seed=seed, min_per_rank=min_per_rank)
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
    return per_rank


@st.composite
def configs(draw):
    world_size = draw(st.integers(1, 8))
    min_per_rank = draw(st.integers(1, 3))
    global_batch = draw(st.integers(world_size * min_per_rank, world_size * min_per_rank + 40))
    num_samples = draw(st.integers(global_batch, global_batch * 6 + 17))
    seed = draw(st.integers(0, 2**31))
    epoch = draw(st.integers(0, 50))
    return num_samples, global_batch, world_size, min_per_rank, seed, epoch


@settings(max_examples=200, deadline=None)
@given(configs())
def test_epoch_partitions_dataset_across_ranks_and_steps(config):
    num_samples, global_batch, world_size, min_per_rank, seed, epoch = config
    batches = epoch_batches(num_samples, global_batch, world_size, seed, epoch, min_per_rank)
    reference = GlobalBatchSampler(num_samples, global_batch, world_size, 0, seed=seed, min_per_rank=min_per_rank)

    # Same number of steps on every rank, equal to len().
    assert {len(rank_batches) for rank_batches in batches} == {len(reference)}

    # Disjoint and covering: the union is exactly range(num_samples), nothing twice.
    flat = [i for rank_batches in batches for batch in rank_batches for i in batch]
    assert sorted(flat) == list(range(num_samples))
    assert all(isinstance(i, int) for i in flat)

    for step in range(len(reference)):
        sizes = [len(batches[rank][step]) for rank in range(world_size)]
        assert min(sizes) >= min_per_rank
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)  # the first m % world_size ranks take the extra one
        assert sum(sizes) == reference.global_counts(step)

    counts = [reference.global_counts(step) for step in range(len(reference))]
    assert all(count == global_batch for count in counts[:-1])
    assert counts[-1] >= world_size * min_per_rank
    # A partial tail is only kept on its own when it does not starve a rank; otherwise it is merged.
    assert counts[-1] < 2 * global_batch


@settings(max_examples=50, deadline=None)
@given(configs())
def test_same_seed_and_epoch_reproduce_and_other_epochs_reshuffle(config):
    num_samples, global_batch, world_size, min_per_rank, seed, epoch = config
    first = epoch_batches(num_samples, global_batch, world_size, seed, epoch, min_per_rank)
    assert epoch_batches(num_samples, global_batch, world_size, seed, epoch, min_per_rank) == first
    if num_samples >= 20:  # a collision of two random permutations is then practically impossible
        assert epoch_batches(num_samples, global_batch, world_size, seed, epoch + 1, min_per_rank) != first


def test_rank_shares_are_consecutive_slices_of_one_global_permutation():
    batches = epoch_batches(103, 16, 3, seed=5, epoch=2)
    order = [i for step in range(len(batches[0])) for rank in range(3) for i in batches[rank][step]]
    single_rank = epoch_batches(103, 16, 1, seed=5, epoch=2)
    # With one rank the same permutation is cut into the same global batches.
    assert order == [i for batch in single_rank[0] for i in batch]
    assert order != list(range(103))


def test_tail_too_small_for_every_rank_is_merged_not_dropped():
    sampler = GlobalBatchSampler(10, 4, 2, 0)  # tail of 2 would give each rank 1 < min_per_rank
    assert len(sampler) == 2
    assert [sampler.global_counts(s) for s in range(2)] == [4, 6]
    assert [len(b) for b in sampler] == [2, 3]


def test_tail_large_enough_is_its_own_step():
    sampler = GlobalBatchSampler(14, 5, 2, 1)  # tail of 4 gives each rank 2
    assert [sampler.global_counts(s) for s in range(len(sampler))] == [5, 5, 4]
    assert [len(b) for b in sampler] == [2, 2, 2]


def test_exact_multiple_has_no_tail():
    sampler = GlobalBatchSampler(64, 16, 4, 3)
    assert len(sampler) == 4
    assert all(len(b) == 4 for b in sampler)


def test_seed_changes_order_and_epoch_seed_pairs_do_not_alias():
    base = epoch_batches(200, 32, 2, seed=0, epoch=1)
    assert epoch_batches(200, 32, 2, seed=1, epoch=1) != base
    assert epoch_batches(200, 32, 2, seed=1, epoch=0) != base  # unlike seed + epoch


def test_iteration_without_set_epoch_is_epoch_zero_and_repeatable():
    sampler = GlobalBatchSampler(50, 10, 2, 0, seed=3)
    first = list(sampler)
    assert list(sampler) == first
    sampler.set_epoch(0)
    assert list(sampler) == first


def test_is_a_torch_sampler_usable_as_dataloader_batch_sampler():
    sampler = GlobalBatchSampler(40, 8, 2, 1, seed=9)
    assert isinstance(sampler, Sampler)
    dataset = TensorDataset(torch.arange(40))
    loaded = [batch[0].tolist() for batch in DataLoader(dataset, batch_sampler=sampler)]
    assert loaded == list(sampler)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((7, 8, 2, 0), "num_samples >= global_batch"),
        ((100, 3, 2, 0), "world_size * min_per_rank"),
        ((100, 8, 0, 0), "world_size must be >= 1"),
        ((100, 8, 2, 2), "rank must be in [0, 1]"),
        ((100, 8, 2, -1), "rank must be in [0, 1]"),
        ((100, 8.0, 2, 0), "global_batch must be an int"),
    ],
)
def test_invalid_configurations_raise_clear_value_errors(args, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("*", r"\*")):
        GlobalBatchSampler(*args)


def test_min_per_rank_is_configurable():
    with pytest.raises(ValueError):
        GlobalBatchSampler(100, 7, 4, 0)  # 7 < 4 * 2
    assert len(GlobalBatchSampler(100, 7, 4, 0, min_per_rank=1)) == 14


def test_global_counts_rejects_out_of_range_steps():
    sampler = GlobalBatchSampler(20, 8, 2, 0)
    with pytest.raises(IndexError):
        sampler.global_counts(len(sampler))
    with pytest.raises(IndexError):
        sampler.global_counts(-1)


def test_set_epoch_rejects_negative():
    with pytest.raises(ValueError, match="epoch"):
        GlobalBatchSampler(20, 8, 2, 0).set_epoch(-1)
