"""The α–β costs of each collective, checked by hand and against the bytes any allreduce must move."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.comm.cost.link import LinkCost
from scalesgd.sim import network
from scalesgd.sim.network import Cluster

UNIT = LinkCost(1.0, 1.0)  # a message costs 1 s plus 1 s per byte


def test_ring_allreduce_by_hand():
    # 4 ranks: 2·3 steps of 1 s + 100/4 bytes
    assert network.ring_allreduce(100, 4, UNIT) == pytest.approx(6 * (1 + 25))
    assert network.ring_allreduce(100, 1, UNIT) == 0.0
    # a node's link shared two ways: every step's bytes take twice as long
    assert network.ring_allreduce(100, 4, UNIT, share=2) == pytest.approx(6 * (1 + 50))


def test_halving_doubling_by_hand_and_its_fold():
    one_node = Cluster(1, 4, inter=UNIT, intra=UNIT)
    # p = 4: two halving steps (50, 25 bytes) and two doubling steps mirror them
    assert network.halving_doubling(100, one_node) == pytest.approx(2 * ((1 + 50) + (1 + 25)))
    # p = 5 folds one pair in and out around the p′ = 4 core: two full-vector steps more
    five = Cluster(1, 5, inter=UNIT, intra=UNIT)
    assert network.halving_doubling(100, five) == pytest.approx(2 * ((1 + 50) + (1 + 25)) + 2 * (1 + 100))


def test_halving_doubling_shares_a_node_link_only_on_steps_that_cross_nodes():
    slow, fast = LinkCost(0.0, 1.0), LinkCost(0.0, 100.0)
    cluster = Cluster(2, 2, inter=slow, intra=fast)  # partner distance 2 crosses nodes, 1 does not
    crossing, inside = 2 * 50 * 2 / 1.0, 2 * 25 / 100.0
    assert network.halving_doubling(100, cluster) == pytest.approx(crossing + inside)


def test_hierarchical_moves_only_a_node_share_across_nodes():
    slow, fast = LinkCost(0.0, 1.0), LinkCost(0.0, 1000.0)
    cluster = Cluster(4, 2, inter=slow, intra=fast)
    inside = 2 * 1 * (400 / 2) / 1000.0  # reduce-scatter + allgather over 2 processes
    across = 2 * 3 * (400 / 2 / 4) * 2 / 1.0  # a ring of 4 nodes per local rank, two rings per link
    assert network.hierarchical(400, cluster) == pytest.approx(inside + across)
    # halving/doubling across the four servers moves the same bytes in fewer steps
    assert network.hierarchical(400, cluster, across="halving_doubling") == pytest.approx(inside + across)


def test_sparse_allgather_by_hand():
    # counts (⌈log2 4⌉ latencies), then 3 ring steps of two messages carrying 10 entries × 8 bytes
    assert network.sparse_allgather(10, 4, UNIT, wire="plain") == pytest.approx(2 + 3 * (2 + 80))
    # compact: one message of 4 bytes an entry
    assert network.sparse_allgather(10, 4, UNIT) == pytest.approx(2 + 3 * (1 + 40))


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="no cost model"):
        network.dense_allreduce(1, "butterfly", Cluster(2, 1, UNIT, UNIT))


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 64), ppn=st.sampled_from([1, 2, 4, 8]), nbytes=st.floats(1e3, 1e9),
       algorithm=st.sampled_from(["ring", "halving_doubling", "hierarchical", "hierarchical_hd"]))
def test_no_algorithm_beats_the_bytes_a_node_must_send(nodes, ppn, nbytes, algorithm):
    """Every node sends at least 2(N−1)/N of the vector across its link (N nodes): no algorithm may take less."""
    link = LinkCost(1e-6, 1e9)
    cluster = Cluster(nodes, ppn, inter=link, intra=LinkCost(1e-6, 1e12))
    took = network.dense_allreduce(nbytes, algorithm, cluster)
    bound = 2 * (nodes - 1) / nodes * nbytes / link.bytes_per_s if nodes > 1 else 0.0
    assert took >= bound * (1 - 1e-9)
    assert network.dense_allreduce(2 * nbytes, algorithm, cluster) >= took  # more bytes never cost less
