import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.comm.cost.planner import plan_dlgs, plan_optimal
from scalesgd.comm.cost.timing import iteration_time
from scalesgd.comm.engine.buckets import check_grouping

T_F, T_B, SIZES = 1.0, [1.0, 2.0, 3.0], [10, 20, 30]


def comm(d):
    return 1 + 0.1 * d


def free(d):
    return 0.0


def test_iteration_time_by_hand():
    # [2]: sparsified at 1+3=4, sent 4→8; [1]: 4+2=6, sent 8→11; [0]: 6+1=7, sent 11→13
    assert iteration_time([[2], [1], [0]], T_F, T_B, SIZES, comm, free) == pytest.approx(13)
    # one message: backward ends at 7, sending 60 takes 7
    assert iteration_time([[2, 1, 0]], T_F, T_B, SIZES, comm, free) == pytest.approx(14)
    # [2]: 4→8; [1, 0]: backward ends at 4+3=7, waits for the link until 8, sends 50 in 6
    assert iteration_time([[2], [1, 0]], T_F, T_B, SIZES, comm, free) == pytest.approx(12)


def test_sparsification_delays_backward_and_sending():
    spars = lambda d: 0.01 * d  # noqa: E731
    # [2]: backward 1→4, sparsify 4→4.3, send 4.3→8.3; [1]: backward 4.3→6.3, sparsify →6.5,
    # send 8.3→11.3; [0]: backward 6.5→7.5, sparsify →7.6, send 11.3→13.3
    assert iteration_time([[2], [1], [0]], T_F, T_B, SIZES, comm, spars) == pytest.approx(13.3)


def test_a_bad_grouping_is_refused():
    for bad in ([[0], [1], [2]], [[2, 1]], [[2], [], [1, 0]], [[2, 0], [1]]):
        with pytest.raises(ValueError, match="grouping"):
            iteration_time(bad, T_F, T_B, SIZES, comm, free)


def all_groupings(layers):
    order = list(range(layers - 1, -1, -1))
    for cuts in itertools.product([False, True], repeat=layers - 1):
        groups, current = [], [order[0]]
        for layer, cut in zip(order[1:], cuts):
            if cut:
                groups.append(current)
                current = [layer]
            else:
                current.append(layer)
        yield groups + [current]


instances = st.integers(1, 7).flatmap(lambda n: st.tuples(
    st.floats(0, 5), st.lists(st.floats(0, 5), min_size=n, max_size=n),
    st.lists(st.integers(0, 1000), min_size=n, max_size=n),
    st.floats(0, 3), st.floats(0, 0.02), st.floats(0, 1), st.floats(0, 0.005)))


@settings(max_examples=150, deadline=None)
@given(instances)
def test_plan_optimal_is_the_exact_minimum_and_never_worse_than_dlgs(instance):
    t_f, t_b, sizes, alpha, beta, s0, s1 = instance
    comm_time = lambda d: alpha + beta * d  # noqa: E731
    spars = lambda d: (s0 + s1 * d) if d else 0.0  # noqa: E731
    layers = len(t_b)
    cost = lambda g: iteration_time(g, t_f, t_b, sizes, comm_time, spars)  # noqa: E731
    best = min(cost(g) for g in all_groupings(layers))
    optimal, greedy = plan_optimal(t_f, t_b, sizes, comm_time, spars), plan_dlgs(t_f, t_b, sizes, comm_time, spars)
    check_grouping(optimal, layers)
    check_grouping(greedy, layers)
    assert cost(optimal) == pytest.approx(best, abs=1e-9)
    assert cost(optimal) <= cost(greedy) + 1e-9
    assert cost(optimal) <= cost([[i] for i in range(layers - 1, -1, -1)]) + 1e-9  # no merging
    assert cost(optimal) <= cost([list(range(layers - 1, -1, -1))]) + 1e-9  # everything in one


def test_high_latency_merges_everything_and_free_messages_merge_nothing():
    t_b, sizes = [1.0] * 6, [100] * 6
    assert plan_optimal(0.5, t_b, sizes, lambda d: 100 + 1e-6 * d, free) == [[5, 4, 3, 2, 1, 0]]
    assert plan_dlgs(0.5, t_b, sizes, lambda d: 100 + 1e-6 * d, free) == [[5, 4, 3, 2, 1, 0]]
    separate = [[5], [4], [3], [2], [1], [0]]
    assert iteration_time(plan_optimal(0.5, t_b, sizes, lambda d: 0.001 * d, free),
                          0.5, t_b, sizes, lambda d: 0.001 * d, free) == pytest.approx(
        iteration_time(separate, 0.5, t_b, sizes, lambda d: 0.001 * d, free))


def test_plan_optimal_handles_hundreds_of_layers():
    import random

    rng = random.Random(0)
    layers = 300
    t_b = [rng.uniform(0.1, 2) for _ in range(layers)]
    sizes = [rng.randint(100, 200_000) for _ in range(layers)]
    comm_time, spars = (lambda d: 0.5 + 1e-5 * d), (lambda d: 0.05 + 1e-6 * d)
    groups = plan_optimal(1.0, t_b, sizes, comm_time, spars)
    check_grouping(groups, layers)
    greedy = plan_dlgs(1.0, t_b, sizes, comm_time, spars)
    assert iteration_time(groups, 1.0, t_b, sizes, comm_time, spars) <= \
        iteration_time(greedy, 1.0, t_b, sizes, comm_time, spars) + 1e-9
