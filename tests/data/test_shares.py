"""Dealer: the samples of an epoch dealt once across rounds of any membership, in the configured workers' shares."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.data import GlobalBatchSampler
from scalesgd.data.shares import Dealer, round_shares


@settings(max_examples=15, deadline=None)
@given(slots=st.integers(1, 4), samples=st.integers(40, 90), epochs=st.integers(1, 2), local_steps=st.integers(1, 5),
       sizes=st.lists(st.integers(1, 4), min_size=1, max_size=30), slow=st.lists(st.integers(0, 4), max_size=30),
       lost=st.integers(0, 29))
def test_each_sample_of_an_epoch_is_trained_once_whoever_is_alive(slots, samples, epochs, local_steps, sizes, slow,
                                                                    lost):
    """Rounds of changing size, their slow members planned fewer steps, deal every share once; the samples of a
    round whose member died are the only ones left out, and at the end fewer than a round's members' shares."""
    plans = [tuple(max(1, local_steps - (slow[(k + r) % len(slow)] if slow else 0)) for r in range(size))
             for k, size in enumerate(sizes)]
    dealer = Dealer(GlobalBatchSampler(samples, 4 * slots, slots, 0, seed=3), epochs)
    trained, dropped, cursor, k = Counter(), set(), 0, 0
    while (plan := dealer.round_plan(cursor, plans[k % len(plans)]))[0]:
        size = len(plan)
        for rank in range(size):
            for share in round_shares(cursor, plan, rank):
                assert dealer.global_step(share) == share // slots
                target = dropped if (k == lost and rank == 0) else trained
                target.update((dealer.epoch_of(share), i) for i in dealer.indices(share))
        cursor, k = cursor + sum(plan), k + 1
    assert dealer.total - cursor < max(map(len, plans))  # less than a round's members' one share each is left
    assert max(trained.values(), default=1) == 1 and not set(trained) & dropped
    left = dealer.total - cursor
    assert len(trained) + len(dropped) == samples * epochs - sum(
        len(dealer.indices(share)) for share in range(cursor, cursor + left))


def test_full_membership_deals_what_the_per_step_sampler_gives_each_rank():
    """With every configured worker alive, member r's t-th share of a round is rank r's batch of the same step."""
    slots, local_steps = 3, 4
    dealer = Dealer(GlobalBatchSampler(100, 12, slots, 0, seed=1), 1)
    for rank in range(slots):
        own = GlobalBatchSampler(100, 12, slots, rank, seed=1)
        own.set_epoch(1)
        expected = list(own)[:local_steps]
        assert [dealer.indices(s) for s in round_shares(0, (local_steps,) * slots, rank)] == expected
