"""DistributedOptimizer against DDP, with gradient accumulation, unused parameters, failures and its state."""

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import Codec
from scalesgd.comm.engine.optimizer import DistributedOptimizer
from scalesgd.comm.wire.collectives import ALGORITHMS
from scalesgd.comm.wire.topology import Topology, build_groups
from scalesgd.data import load_bundle
from scalesgd.models import build_model
from scalesgd.recipe import build_sgd, initialize
from tests.comm.exchanging import same_state
from tests.spawn_util import run_workers

PLANS = ("size:0.05", "growing:0.02", "layer", "single")
ITERS, PER_RANK = 12, 32


def _model():
    torch.manual_seed(0)
    return initialize(build_model("resnet8", 10, 1))


def _train(rank, world, wrap):
    """25 SGD iterations of resnet8 on digits, each rank on its own slice; returns the parameters."""
    data = load_bundle("digits").train
    model = _model()
    if rank == 1:  # ranks start different: the engine must broadcast rank 0's parameters
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
    opt = build_sgd(model, lr=0.01, momentum=0.9, nesterov=False, weight_decay=1e-4)
    net, opt = wrap(model, opt)
    g = torch.Generator().manual_seed(5)
    for _ in range(ITERS):
        idx = torch.randperm(len(data), generator=g)[: PER_RANK * world].view(world, PER_RANK)[rank]
        loss = nn.functional.cross_entropy(net(data.x[idx]), data.y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
    if hasattr(opt, "close"):
        opt.close()
    return [p.detach().clone() for p in model.parameters()] + [b.clone() for b in model.buffers()]


def _equivalence(rank, world):
    reference = _train(rank, world, lambda m, o: (DistributedDataParallel(m), o))
    groups = build_groups(Topology(world, rank, 2))
    failures = []
    for algorithm, plan in every_one_once(list(ALGORITHMS), PLANS):
        got = _train(rank, world, lambda m, o: (m, DistributedOptimizer(
            o, m, algorithm=algorithm, buckets=plan, topology=groups)))
        if relative_distance(got, reference) > 1e-5:
            failures.append((algorithm, plan, relative_distance(got, reference)))
    return failures


def every_one_once(algorithms: list[str], plans: tuple[str, ...]) -> list[tuple[str, str]]:
    """Pairs in which each algorithm and each plan appears once at least: each algorithm on every size and layout a
    bucket can have is tests/comm/wire/test_collectives.py's; this is the engine's bucketing around them."""
    n = max(len(algorithms), len(plans))
    return [(algorithms[i % len(algorithms)], plans[i % len(plans)]) for i in range(n)]


def relative_distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over every floating-point parameter and buffer taken as one vector."""
    pairs = [(x.flatten(), y.flatten()) for x, y in zip(a, b) if x.is_floating_point()]
    return (torch.cat([x - y for x, y in pairs]).norm() / torch.cat([y for _, y in pairs]).norm()).item()


def test_a_dozen_iterations_match_ddp_for_every_algorithm_and_bucket_plan():
    for failures in run_workers(_equivalence, 4):
        assert failures == []


class _BNFree(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 6 * 6, 10)
        self.unused = nn.Linear(3, 3)  # used by rank 1 only (see forward)

    def forward(self, x, use_extra=False):
        out = self.fc(torch.relu(self.conv(x)).flatten(1))
        if use_extra:
            out = out + self.unused(torch.ones(1, 3)).sum()
        return out


def _accumulate(rank, world):
    data = load_bundle("digits").train
    x, y = data.x[rank * 24:(rank + 1) * 24], data.y[rank * 24:(rank + 1) * 24]
    model = _BNFree()
    engine = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, buckets="size:0.001")
    with engine.no_sync():
        for part in range(2):  # two micro-batches accumulate locally
            nn.functional.cross_entropy(model(x[part * 8:(part + 1) * 8]), y[part * 8:(part + 1) * 8],
                                        reduction="sum").div(24).backward()
    nn.functional.cross_entropy(model(x[16:]), y[16:], reduction="sum").div(24).backward()
    engine.synchronize()
    accumulated = [p.grad.clone() for p in model.parameters()]
    engine.zero_grad()

    model(x, use_extra=rank == 1).sum().mul(0).add(
        nn.functional.cross_entropy(model(x), y)).backward()  # `unused` gets a grad on rank 1 only
    engine.synchronize()
    with_unused = [p.grad.clone() for p in model.parameters()]
    engine.close()
    return accumulated, with_unused


def test_no_sync_accumulation_equals_the_larger_batch_and_unused_parameters_never_hang():
    results = run_workers(_accumulate, 2)
    data = load_bundle("digits").train
    model = _BNFree()
    nn.functional.cross_entropy(model(data.x[:48]), data.y[:48]).backward()
    for got, p in zip(results[0][0], model.parameters()):
        if p.grad is not None:
            assert torch.allclose(got, p.grad, rtol=1e-5, atol=1e-7)
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))  # same on every rank


class _Broken(Codec):
    name = "broken"

    def start(self, flat, bucket, channel, scratch):
        raise RuntimeError("codec exploded")


def _codec_failure(rank, world):
    model = _BNFree()
    engine = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, codec=_Broken())
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    try:
        engine.step()
    except RuntimeError as err:
        return str(err)
    return None


def test_an_error_in_the_communication_thread_surfaces_in_step():
    assert run_workers(_codec_failure, 1) == ["codec exploded"]


def _state(rank, world, codec):
    """Three steps, a checkpoint taken and loaded into a fresh engine around a copy of the model, then a fourth
    step on both: the states, and the fourth step's gradients."""
    data = load_bundle("digits").train
    model = _model()

    def engine_of(net):
        return DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), net, codec=codec,
                                    buckets="layer", compress_after=1)

    def step(engine, net, i):
        x, y = data.x[32 * (2 * i + rank):][:32], data.y[32 * (2 * i + rank):][:32]
        nn.functional.cross_entropy(net(x), y).backward()
        engine.step()
        grads = [p.grad.clone() for p in net.parameters()]
        engine.zero_grad()
        return grads

    engine = engine_of(model)
    for i in range(3):
        step(engine, model, i)
    state = engine.state_dict()
    twin = _model()
    twin.load_state_dict(model.state_dict())
    fresh = engine_of(twin)
    fresh.load_state_dict(state)
    loaded = fresh.state_dict()
    after = step(engine, model, 3), step(fresh, twin, 3)
    engine.close()
    fresh.close()
    return state["engine"], loaded["engine"], after


@pytest.mark.parametrize("codec,kept", [("topk", "residual"), ("fp8", "q")])
def test_state_dict_round_trips_the_codec_s_state_value_by_value_and_the_run_continues_alike(codec, kept):
    for saved, loaded, (grads, twin_grads) in run_workers(_state, 2, codec):
        assert saved["codec"] == codec and saved["buckets"] == "layer"
        assert saved["codec_state"]["done"] and set(saved["codec_state"]["done"].values()) == {3}  # dense-first
        assert same_state(saved["codec_state"], loaded["codec_state"])
        found = list(_values(saved["codec_state"]["inner"], kept))
        assert found and any(bool(torch.as_tensor(v).abs().sum()) for v in found)  # real state, not zeros
        assert all(torch.equal(a, b) for a, b in zip(grads, twin_grads))


def _values(state, key):
    """Every value stored under `key` anywhere in a nested state."""
    if isinstance(state, dict):
        for k, v in state.items():
            if k == key:
                yield v
            else:
                yield from _values(v, key)


def _grads_in_buckets(rank, world):
    """Every `.grad` is a view of its bucket before and after each step: autograd accumulates into the bucket."""
    data = load_bundle("digits").train
    model = _BNFree()
    engine = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, buckets="size:0.001")
    buffers = {b.buffer.untyped_storage().data_ptr() for b in engine._buckets}
    first = [p.grad for p in model.parameters()]
    views = []
    for it in range(3):
        x, y = data.x[rank * 8 + it:rank * 8 + it + 8], data.y[rank * 8 + it:rank * 8 + it + 8]
        nn.functional.cross_entropy(model(x), y).backward()
        views.append(all(p.grad is g for p, g in zip(model.parameters(), first)))  # the same tensors: no new grad
        engine.step()
        engine.zero_grad(set_to_none=True)
        zeroed = all(p.grad is not None and not p.grad.any() for p in model.parameters())
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    engine.close()
    return views, zeroed, storages <= buffers


def test_gradients_are_views_of_the_buckets_and_zero_grad_keeps_them():
    for views, zeroed, in_buckets in run_workers(_grads_in_buckets, 2):
        assert views == [True, True, True]
        assert zeroed and in_buckets
