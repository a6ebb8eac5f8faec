"""Node arithmetic, reading the topology from the environment, and the groups it creates."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from scalesgd.comm.wire.topology import Topology, build_groups
from tests.spawn_util import run_workers


@pytest.fixture
def env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_from_env_reads_local_world_size(env):
    env.setenv("RANK", "5")
    env.setenv("WORLD_SIZE", "8")
    env.setenv("LOCAL_WORLD_SIZE", "4")
    t = Topology.from_env()
    assert (t.world_size, t.rank, t.procs_per_node) == (8, 5, 4)
    assert (t.node, t.local_rank, t.num_nodes) == (1, 1, 2)


def test_from_env_without_local_world_size_is_one_node(env):
    env.setenv("RANK", "2")
    env.setenv("WORLD_SIZE", "6")
    t = Topology.from_env()
    assert (t.procs_per_node, t.num_nodes, t.node, t.local_rank) == (6, 1, 0, 2)


def test_from_env_argument_overrides_environment(env):
    env.setenv("RANK", "3")
    env.setenv("WORLD_SIZE", "6")
    env.setenv("LOCAL_WORLD_SIZE", "6")
    assert Topology.from_env(procs_per_node=3).num_nodes == 2


def test_from_env_without_anything_is_a_single_rank(env):
    assert Topology.from_env() == Topology(1, 0, 1)


def test_indivisible_world_size_is_one_clear_line(env):
    with pytest.raises(ValueError, match="world size 6 is not divisible by procs_per_node 4") as err:
        Topology(world_size=6, rank=0, procs_per_node=4)
    assert "\n" not in str(err.value)
    env.setenv("WORLD_SIZE", "6")
    env.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="not divisible"):
        Topology.from_env()


@pytest.mark.parametrize("args", [(0, 0, 1), (4, 4, 2), (4, -1, 2), (4, 0, 0)])
def test_invalid_fields_are_rejected(args):
    with pytest.raises(ValueError):
        Topology(*args)


@given(st.integers(1, 16), st.integers(1, 16), st.data())
def test_node_and_local_rank_arithmetic(nodes, per_node, data):
    rank = data.draw(st.integers(0, nodes * per_node - 1))
    t = Topology(nodes * per_node, rank, per_node)
    assert t.num_nodes == nodes
    assert t.node * per_node + t.local_rank == rank and 0 <= t.local_rank < per_node
    assert set(t.node_ranks()) & set(t.cross_ranks()) == {rank}
    assert len(t.node_ranks()) == per_node and len(t.cross_ranks()) == nodes
    assert all(Topology(t.world_size, r, per_node).node == t.node for r in t.node_ranks())
    assert all(Topology(t.world_size, r, per_node).local_rank == t.local_rank for r in t.cross_ranks())


def members(group, world):
    """The global ranks in `group`, found by summing one-hot rank vectors inside it."""
    one_hot = torch.zeros(world, dtype=torch.int64)
    one_hot[dist.get_rank()] = 1
    dist.all_reduce(one_hot, group=group)
    return one_hot.nonzero().flatten().tolist()


def group_members(rank, world):
    topo = Topology.from_env(procs_per_node=2)
    groups = topo.groups()
    again = topo.groups()
    explicit = build_groups(topo, backend="gloo")
    return dict(
        topology=(topo.node, topo.local_rank),
        cached=groups is again,
        node=members(groups.node_group, world),
        cross=members(groups.cross_group, world),
        node_gloo=members(explicit.node_group, world),
        cross_gloo=members(explicit.cross_group, world),
    )


def test_groups_hold_the_expected_global_ranks():
    results = run_workers(group_members, 4)
    for rank, r in enumerate(results):
        assert r["topology"] == (rank // 2, rank % 2)
        assert r["cached"]
        assert r["node"] == r["node_gloo"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert r["cross"] == r["cross_gloo"] == [rank % 2, rank % 2 + 2]
