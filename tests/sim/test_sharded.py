"""The sharded modes' step: unit by unit, each all-gathered before its forward and backward, its sum after, on one
channel; every collective in its thread on gloo, a unit ahead and behind compute on NCCL."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.comm.cost.link import LinkCost
from scalesgd.errors import UsageError
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.exchange import Costs, check_modelled, predict
from scalesgd.sim.modes import parse_mode
from scalesgd.sim.network import Cluster, reduce_scatter, ring_allreduce
from scalesgd.sim.sharded import sum_s

MB = 1 << 20
# an embedding (root), two units of two tensors each, a head (root): forward 1 s, backward 3 s, step 0.4 s
PROFILE = ComputeProfile(("emb.weight", "blocks.0.w", "blocks.0.b", "blocks.1.w", "blocks.1.b", "head.weight"),
                         (MB, 2 * MB, MB, 2 * MB, MB, MB), 1.0, (0.5, 0.5, 0.5, 0.5, 0.5, 0.5), 0.4, 8,
                         shapes=((1024, 1024), (2048, 1024), (1024, 1024), (2048, 1024), (1024, 1024), (1024, 1024)),
                         units=("blocks.0", "blocks.1"))
GLOO, NCCL = Costs(fsdp_backend="gloo"), Costs()


def flat(rate: float, nodes: int = 2, procs: int = 1) -> Cluster:
    """No latency anywhere, `rate` bytes/s between nodes, 100× that inside them."""
    return Cluster(nodes, procs, inter=LinkCost(0.0, rate), intra=LinkCost(0.0, 100 * rate))


def test_on_gloo_a_step_is_its_compute_its_step_on_the_shards_and_every_collective_in_turn():
    cluster, p = flat(1e8, nodes=4), 4
    gather = lambda n: reduce_scatter(4 * n, p, cluster.inter)  # noqa: E731
    unit = 3 * MB
    collectives = (gather(2 * MB)  # the root, once: it stays gathered
                   + 2 * 2 * gather(unit)  # each unit before its forward and again before its backward
                   + 2 * reduce_scatter(4 * unit, p, cluster.inter) + reduce_scatter(4 * 2 * MB, p, cluster.inter))
    step = predict(parse_mode("scalesgd-fsdp"), PROFILE, cluster, GLOO)
    assert step.iteration_s == pytest.approx(4.0 + 0.4 / p + collectives)
    assert step.exposed_comm_s == pytest.approx(collectives)


def test_each_accumulated_micro_batch_gathers_again_and_only_the_last_sums():
    cluster, p = flat(1e8, nodes=4), 4
    one = predict(parse_mode("scalesgd-fsdp-bf16"), PROFILE, cluster, GLOO)
    three = predict(parse_mode("scalesgd-fsdp-bf16"), replace(PROFILE, accumulate=3), cluster, GLOO)
    gathers = reduce_scatter(4 * 2 * MB, p, cluster.inter) + 2 * 2 * reduce_scatter(4 * 3 * MB, p, cluster.inter)
    assert three.iteration_s == pytest.approx(one.iteration_s + 2 * (4.0 + gathers))


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(1e5, 1e11), mode=st.sampled_from(["scalesgd-fsdp", "scalesgd-fsdp-bf16", "scalesgd-fsdp-fp8",
                                                       "scalesgd-fsdp-topk@0.01", "scalesgd-fsdp:node-fp8",
                                                       "fsdp2:node-bf16", "scalesgd-fsdp-lowrank"]))
def test_on_nccl_prefetch_and_sums_behind_compute_never_cost_more_than_gloos_turns(rate, mode):
    cluster = flat(rate, nodes=2, procs=2)
    nccl, gloo = predict(parse_mode(mode), PROFILE, cluster, NCCL), predict(parse_mode(mode), PROFILE, cluster, GLOO)
    assert 4.0 + 0.4 / 4 - 1e-9 <= nccl.iteration_s <= gloo.iteration_s + 1e-9


def test_on_nccl_a_fast_link_hides_all_but_the_first_gathers_and_the_roots_sum():
    cluster = flat(1e12, nodes=4)
    nccl = predict(parse_mode("scalesgd-fsdp"), PROFILE, cluster, NCCL)
    gloo = predict(parse_mode("scalesgd-fsdp"), PROFILE, cluster, GLOO)
    gather = lambda n: reduce_scatter(4 * n, 4, cluster.inter)  # noqa: E731
    # exposed: the root's gather, unit 0's before forward, unit 1's before backward, and the root's sum (unit 0's
    # runs behind the embedding's backward, unit 1's behind unit 0's)
    exposed = gather(2 * MB) + 2 * gather(3 * MB) + reduce_scatter(4 * 2 * MB, 4, cluster.inter)
    assert nccl.exposed_comm_s == pytest.approx(exposed)
    assert gloo.exposed_comm_s > nccl.exposed_comm_s * 1.4


def test_the_codecs_sum_sends_their_wire_and_fsdp2_on_gloo_an_allreduce():
    cluster = flat(1e8, nodes=4)
    fp32 = sum_s(parse_mode("scalesgd-fsdp"), MB, cluster)
    assert fp32 == pytest.approx(reduce_scatter(4 * MB, 4, cluster.inter))
    assert sum_s(parse_mode("scalesgd-fsdp-bf16"), MB, cluster) == pytest.approx(fp32 / 2)
    assert sum_s(parse_mode("scalesgd-fsdp-fp8"), MB, cluster) == pytest.approx(fp32 / 4
                                                                                + ring_allreduce(4, 4, cluster.inter))
    assert sum_s(parse_mode("fsdp2"), MB, cluster, backend="nccl") == pytest.approx(fp32)
    assert sum_s(parse_mode("fsdp2"), MB, cluster, backend="gloo") == pytest.approx(2 * fp32)


def test_across_nodes_the_codec_sends_each_ranks_shard_and_the_node_shares_its_link():
    cluster = flat(1e8, nodes=2, procs=2)
    inside = reduce_scatter(4 * MB, 2, cluster.intra)
    across_fp32 = ring_allreduce(4 * MB / 2, 2, cluster.inter, share=2)  # two ranks' shards on one node's link
    assert sum_s(parse_mode("scalesgd-fsdp:node"), MB, cluster) == pytest.approx(inside + across_fp32)
    assert sum_s(parse_mode("scalesgd-fsdp:node-fp8"), MB, cluster) == pytest.approx(inside + across_fp32 / 4)
    gathered = predict(parse_mode("scalesgd-fsdp:node"), PROFILE, flat(1.0, nodes=2, procs=2), GLOO)  # 1 byte/s across
    assert gathered.iteration_s > 1e5  # the sum crosses nodes: a slow link shows …
    assert predict(parse_mode("scalesgd-fsdp:node"), PROFILE, Cluster(1, 2, LinkCost(0, 1.0), LinkCost(0, 1e10)),
                   GLOO).iteration_s < 5  # … and one node's gathers and sums never touch it


@pytest.mark.parametrize("name, shard, codec, given", [
    ("scalesgd-fsdp", "", "fp32", {}), ("scalesgd-fsdp:node-topk@0.01", "node", "topk", {"density": 0.01}),
    ("scalesgd-fsdp-lowrank@2", "", "lowrank", {"rank": 2}), ("fsdp2:node-bf16", "node", "bf16", {})])
def test_sharded_modes_parse_their_layout_and_codec(name, shard, codec, given):
    mode = parse_mode(name)
    assert (mode.shard, mode.codec, mode.codec_options()) == (shard, codec, given)


@pytest.mark.parametrize("name, message", [
    ("fsdp2-fp8", "codec 'fp8' does not run on fsdp2; choose from fp32, fp16, bf16"),
    ("scalesgd-fsdp-topk-global", "codec 'topk-global' does not run on scalesgd-fsdp"),
    ("scalesgd-fsdp-fp8-ring", "a sharded mode's units are its buckets"),
    ("scalesgd-fsdp:rack-fp8", "a sharded mode is scalesgd-fsdp[:node]"),
])
def test_a_sharded_mode_that_cannot_run_is_refused_saying_what_can(name, message):
    with pytest.raises(UsageError, match=None) as err:
        check_modelled(parse_mode(name))
    assert message in str(err.value)


def test_a_profile_without_units_cannot_cost_a_sharded_mode():
    with pytest.raises(ValueError, match="names no units; give --model"):
        predict(parse_mode("scalesgd-fsdp"), ComputeProfile(("a",), (MB,), 1.0, (1.0,), 0.0, 8), flat(1e8), GLOO)
