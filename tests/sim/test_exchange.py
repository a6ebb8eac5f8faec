"""One mode's predicted iteration: buckets, wire, codec and the compute its work displaces."""

import math
from dataclasses import replace

import pytest

from scalesgd.comm.cost.link import LinkCost
from scalesgd.comm.engine.buckets import TensorInfo, ddp_buckets
from scalesgd.sim.compute import ComputeProfile
from scalesgd.comm.codecs import CodecOptions, LowrankOptions
from scalesgd.comm.codecs.lowrank.factors import layout
from scalesgd.sim.exchange import Costs, check_modelled, grouping, predict, sent_sizes, wire_time
from scalesgd.sim.modes import Mode, parse_mode
from scalesgd.sim.network import Cluster

MB = 1 << 20
PROFILE = ComputeProfile(("a", "b", "c", "d"), (MB, MB, 4 * MB, 2 * MB), 1.0, (0.5, 0.5, 1.0, 1.0), 0.25, 32)


def cluster(rate=1e8, nodes=2):
    return Cluster(nodes, 1, inter=LinkCost(1e-4, rate), intra=LinkCost(1e-5, 1e10))


def test_no_exchange_is_the_compute_and_the_step():
    for mode in ("none", "scalesgd-fp8"):
        p = predict(parse_mode(mode), PROFILE, cluster(nodes=1) if mode != "none" else cluster())
        assert p.iteration_s == pytest.approx(4.25) and p.exposed_comm_s == 0.0  # forward 1, backward 3, step


def test_accumulated_micro_batches_add_their_compute_before_the_one_that_exchanges():
    three = replace(PROFILE, accumulate=3)
    for mode in ("none", "scalesgd-fp32", "ddp"):
        one, more = predict(parse_mode(mode), PROFILE, cluster(rate=1e7)), predict(parse_mode(mode), three,
                                                                                  cluster(rate=1e7))
        assert more.iteration_s == pytest.approx(one.iteration_s + 2 * 4.0)  # two more forward + backward passes
        assert more.exposed_comm_s == pytest.approx(one.exposed_comm_s)  # the exchange still overlaps the last


def test_a_free_network_costs_nothing_and_a_slow_one_is_exposed():
    fast = predict(parse_mode("scalesgd-fp32"), PROFILE, cluster(rate=1e15))
    assert fast.iteration_s == pytest.approx(4.25, rel=1e-3)
    slow = predict(parse_mode("scalesgd-fp32"), PROFILE, cluster(rate=1e7))
    assert slow.exposed_comm_s > 1.0 and slow.iteration_s == pytest.approx(
        slow.compute_s + slow.exposed_comm_s + 0.25)


def test_fewer_bytes_per_element_travel_faster():
    times = [wire_time(parse_mode(m), 8 * MB, cluster()) for m in ("scalesgd-fp32", "scalesgd-fp16", "scalesgd-fp8")]
    assert times[0] > times[1] > times[2]
    assert wire_time(parse_mode("scalesgd-topk@0.01"), 8 * MB, cluster()) < times[2]


def test_exchange_cpu_slows_backward_only_while_they_overlap():
    mode = parse_mode("scalesgd-fp32-ring-layer")
    plain = predict(mode, PROFILE, cluster())
    shared = predict(mode, PROFILE, cluster(), Costs(exchange_cpu_s=0.5))
    assert 0 < shared.compute_s - plain.compute_s < 0.5  # only the overlapped share is taken from compute
    single = parse_mode("scalesgd-fp32-ring-single")  # one bucket after backward: nothing overlaps
    assert predict(single, PROFILE, cluster(), Costs(exchange_cpu_s=0.5)).compute_s == pytest.approx(4.0)


def test_ddp_modes_use_ddps_buckets_and_planner_modes_the_planner():
    tensors = [TensorInfo(n, s) for n, s in zip(PROFILE.names, PROFILE.sizes)]
    ddp = grouping(parse_mode("ddp"), PROFILE, lambda d: 0.0, lambda d: 0.0)
    assert ddp == [list(b) for b in ddp_buckets(tensors).buckets] == [[3], [2, 1, 0]]
    planned = grouping(parse_mode("scalesgd-fp16-ring-planner:optimal"), PROFILE, lambda d: 1e-9 * d + 0.1,
                       lambda d: 0.0)
    assert sorted(i for g in planned for i in g) == [0, 1, 2, 3]


def test_modes_without_a_cost_model_are_refused():
    with pytest.raises(ValueError, match="no cost model"):
        check_modelled(parse_mode("ddp-onebit"))
    for known in ("scalesgd-topk-nodes@0.01", "ddp-powersgd", "scalesgd-lowrank-acp@2/bf16"):
        check_modelled(parse_mode(known))


SHAPES = ((64, 3, 3, 3), (64,), (128, 64, 3, 3), (128,), (10, 128), (10,))


def test_a_low_rank_mode_is_costed_by_the_numbers_its_codec_sends():
    profile = ComputeProfile(tuple("abcdef"), tuple(math.prod(s) for s in SHAPES), 1.0, (0.1,) * 6, 0.0, 32,
                             shapes=SHAPES)
    plan = layout(list(range(6)), [0] * 6, SHAPES, profile.numel, 4, LowrankOptions().min_rate)
    assert sum(sent_sizes(parse_mode("scalesgd-lowrank@4"), profile)) == plan.p_numel + plan.q_numel + plan.dense_numel
    assert sum(sent_sizes(parse_mode("scalesgd-lowrank-acp@4"), profile)) == (plan.p_numel + plan.q_numel) / 2 \
        + plan.dense_numel
    assert plan.dense_numel < profile.numel and plan.p_numel + plan.q_numel < profile.numel - plan.dense_numel
    slow = cluster(rate=1e6)
    sums = {m: wire_time(parse_mode(m), 1000, slow) for m in ("scalesgd-lowrank@4/fp16", "scalesgd-lowrank-acp@4/fp16",
                                                              "scalesgd-lowrank@4", "ddp-powersgd")}
    one_sum = wire_time(parse_mode("scalesgd-fp16"), 1000, slow)  # a 16-bit allreduce of as many numbers
    assert sums["scalesgd-lowrank-acp@4/fp16"] == pytest.approx(one_sum)
    assert sums["scalesgd-lowrank@4/fp16"] == pytest.approx(one_sum + 2 * slow.inter.alpha_s)  # its bytes, two sums
    assert sums["ddp-powersgd"] > sums["scalesgd-lowrank@4"] > sums["scalesgd-lowrank@4/fp16"]  # fp32, three sums
    times = [predict(parse_mode(m), profile, slow).exposed_comm_s for m in ("scalesgd-fp32", "ddp-powersgd",
                                                                           "scalesgd-lowrank-acp@4/fp16")]
    assert times == sorted(times, reverse=True) and times[2] > 0
    with pytest.raises(ValueError, match="lacks"):
        predict(parse_mode("scalesgd-lowrank"), replace(profile, shapes=()), slow)


def test_a_low_rank_mode_is_costed_with_the_runs_own_compression_rule():
    """--lowrank-min-rate reaches the simulator: a rule no matrix meets sends every tensor whole."""
    profile = ComputeProfile(tuple("abcdef"), tuple(math.prod(s) for s in SHAPES), 1.0, (0.1,) * 6, 0.0, 32,
                             shapes=SHAPES)
    strict = CodecOptions.of(LowrankOptions(rank=4, min_rate=1e6))
    assert sum(sent_sizes(Mode("lowrank", "scalesgd", "lowrank", base=strict), profile)) == profile.numel
    assert sum(sent_sizes(Mode("lowrank", "scalesgd", "lowrank"), profile)) < profile.numel


def test_a_periodic_round_is_h_steps_of_compute_and_one_exchange_hidden_behind_its_overlap():
    net = cluster(rate=1e6)  # 1 MB/s: the model's 8 Mi fp32 numbers take ~67 s on a 2-node ring
    compute = predict(parse_mode("none"), PROFILE, net).iteration_s
    whole = wire_time(parse_mode("scalesgd-fp32"), 8 * MB, net)
    plain = predict(parse_mode("periodic@10"), PROFILE, net)
    assert plain.iteration_s == pytest.approx(compute + whole / 10)
    assert plain.exposed_comm_s == pytest.approx(whole / 10)
    slow = cluster(rate=1e5)  # a fragment's 2 Mi fp8 numbers take ~21 s: more than 3 steps of compute hide
    fragment = wire_time(parse_mode("scalesgd-fp8"), 2 * MB, slow)
    streamed = predict(parse_mode("periodic@20/4/3-fp8"), PROFILE, slow)  # 4 landings a round, each 3 steps behind
    assert streamed.exposed_comm_s == pytest.approx(4 * (fragment - 3 * compute) / 20)
    hidden = predict(parse_mode("periodic@20/4/4-fp8"), PROFILE, cluster(rate=1e8))
    assert hidden.iteration_s == pytest.approx(compute)  # a fast link: each fragment's exchange hides entirely


@pytest.mark.parametrize("text,words", [("periodic@10/3", "fragments 3: give a divisor of local_steps 10"),
                                        ("periodic@10/2/5", "overlap_steps 5: give 0 to 4"),
                                        ("periodic@10-powersgd", "none of ours"), ("periodic", "periodic@H"),
                                        ("periodic@16-topk@0.01", "takes no @AMOUNT or /WIRE.*periodic@16-topk")])
def test_a_periodic_mode_that_cannot_run_is_refused(text, words):
    with pytest.raises(ValueError, match=words):
        parse_mode(text)
