"""One mode's predicted iteration: buckets, wire, codec and the compute its work displaces."""

from dataclasses import replace

import pytest

from scalesgd.comm.cost.link import LinkCost
from scalesgd.comm.engine.buckets import TensorInfo, ddp_buckets
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.exchange import Costs, check_modelled, grouping, predict, wire_time
from scalesgd.sim.modes import parse_mode
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
        check_modelled(parse_mode("ddp-powersgd"))
    check_modelled(parse_mode("scalesgd-topk-nodes@0.01"))
