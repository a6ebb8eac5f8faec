import pytest
import torch

from scalesgd.comm.cost.profile import Profile, fit_line, slowest_rank, time_layers, time_sparsify
from scalesgd.models import build_model
from tests.spawn_util import run_workers


def test_fit_line_recovers_a_line_and_never_goes_negative():
    a, b = fit_line([1, 2, 3, 4], [2.5, 3.0, 3.5, 4.0])
    assert a == pytest.approx(2.0) and b == pytest.approx(0.5)
    assert fit_line([1, 2, 3], [3.0, 2.0, 1.0]) == (2.0, 0.0)  # a falling fit is clamped flat


def test_time_layers_gives_every_tensor_a_time_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = (torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,)))
    t_f, t_b = time_layers(model, batch, torch.nn.functional.cross_entropy, iterations=2, warmup=1)
    params = [p for p in model.parameters()]
    assert t_f > 0 and len(t_b) == len(params)
    assert all(t >= 0 for t in t_b) and sum(t_b) > 0
    assert all(p.grad is None for p in params)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # BN statistics restored


def test_selection_cost_grows_with_size():
    small, large = 1 << 10, 1 << 20
    a, b = time_sparsify([small, large], density=0.1, reuse=2, repeats=2)
    cost = lambda d: a + b * d  # noqa: E731  the fitted selection time the planner prices a group of d at
    # 1024× the elements: top-k's selection and packing cost close to 1000× as much (77× to 990× in 15 fits on a
    # loaded 2-core machine, ~0.2 ms against 20–180 ms). 10× can fail only if the cost barely depends on the size,
    # not because the small size's 0.2 ms caught a stall of a few ms.
    assert cost(large) > 10 * cost(small), (a, b)


def test_profile_round_trips_and_prices_empty_groups_at_zero():
    p = Profile(["w"], [10], 0.1, [0.2], (1e-3, 1e-9), (1e-4, 1e-8), 0.1, 10, 2)
    assert Profile.from_dict(p.to_dict()) == p
    assert p.comm_time(0) == 0 and p.comm_time(1000) == pytest.approx(1e-3 + 1e-6)
    assert p.sparsify_time(100) == pytest.approx(1e-4 + 1e-6)


def _slowest(rank, world_size):
    # rank 1 has the longest iteration in total, though not the longest forward or every layer
    times = {0: (0.5, [0.1, 0.1]), 1: (0.2, [0.3, 0.4]), 2: (0.1, [0.6, 0.1])}[rank]
    return slowest_rank(*times)


def test_every_rank_takes_the_times_of_the_rank_with_the_longest_iteration():
    assert run_workers(_slowest, 3) == [(0.2, [0.3, 0.4])] * 3
    assert slowest_rank(0.5, [0.1]) == (0.5, [0.1])  # without a process group: this rank's own
