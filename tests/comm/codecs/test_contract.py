"""Every registered codec keeps the one contract (`comm/codecs/base.py`), checked alike on 2 gloo ranks through the
engine's driver: the same mean on every rank; a step whose sum is not finite, skipped under a loss scaler, leaves
no trace; its state saved and loaded continues bit for bit; and its state is keyed by parameter, not by bucket."""

import copy

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.codecs import CODECS, Channel, make_codec
from scalesgd.comm.codecs.registry import needs_topology
from scalesgd.comm.engine.driver import BucketDriver
from scalesgd.comm.wire.topology import Topology
from tests.comm.exchanging import Unscaled, same_state, view_of
from tests.spawn_util import run_workers

SHAPES = [(32, 24), (24,), (16, 12)]  # a matrix lowrank factors, a bias, one too small to factor
BUILT = [name for name, entry in CODECS.items() if entry.build is not None]


def gradient(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(sum(torch.Size(s).numel() for s in SHAPES), generator=g)


def driver_for(name: str, channel: Channel) -> BucketDriver:
    driver = BucketDriver(make_codec(name), channel)
    driver.follow(Unscaled())
    return driver


def step(driver: BucketDriver, view, rank: int, number: int, poison: bool = False) -> torch.Tensor:
    flat = gradient(rank, number)
    if poison and rank == 1:
        flat[3] = float("nan")
    driver.exchange(flat, view)
    return flat


def contract(rank, world):
    """Per codec: each step's mean, the states around a poisoned step, a continuation from a loaded state, and the
    same steps with the bucket under another index."""
    params = [torch.zeros(s) for s in SHAPES]
    view, elsewhere = view_of(params), view_of(params, index=7)
    channel = Channel(dist.group.WORLD, world, topology=Topology(world, rank, world).groups())
    out = {}
    for name in BUILT:
        driver = driver_for(name, channel)
        means = [step(driver, view, rank, 0)]
        before = copy.deepcopy(driver.codec.state_dict())
        poisoned = step(driver, view, rank, 1, poison=True)
        after = copy.deepcopy(driver.codec.state_dict())
        means.append(step(driver, view, rank, 2))
        saved = copy.deepcopy(driver.codec.state_dict())
        resumed = driver_for(name, channel)
        resumed.codec.load_state_dict(copy.deepcopy(saved))
        continued, again = step(driver, view, rank, 3), step(resumed, view, rank, 3)
        moved = driver_for(name, channel)
        moved_means = [step(moved, elsewhere, rank, n, poison=n == 1) for n in range(3)]
        out[name] = {"means": means + [continued], "poisoned": poisoned, "undone": same_state(before, after),
                     "resumed": torch.equal(continued, again) and same_state(driver.codec.state_dict(),
                                                                           resumed.codec.state_dict()),
                     "moved": all(torch.equal(a, b) for a, b in zip(means, moved_means[::2])),
                     "state": saved, "moved_state": moved.codec.state_dict()}
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_workers(contract, 2)


def test_every_rank_writes_the_same_finite_mean(ranks):
    for name in BUILT:
        for first, second in zip(ranks[0][name]["means"], ranks[1][name]["means"]):
            assert torch.isfinite(first).all() and torch.equal(first, second), name


def test_a_non_finite_sum_fills_every_ranks_bucket_and_a_skipped_step_leaves_no_trace(ranks):
    for rank in ranks:
        for name in BUILT:
            poisoned, keeps_state = rank[name]["poisoned"], bool(rank[name]["state"])
            # a codec with state fills the whole bucket (the engine reads its first number); a plain sum leaves the
            # NaN where it arose, and has nothing to undo
            assert (torch.isnan(poisoned).all() if keeps_state else torch.isnan(poisoned).any()), name
            assert rank[name]["undone"], name


def test_a_loaded_state_continues_bit_for_bit(ranks):
    for rank in ranks:
        for name in BUILT:
            assert rank[name]["resumed"], name


def test_state_is_keyed_by_parameter_not_by_the_buckets_index(ranks):
    for rank in ranks:
        for name in BUILT:
            assert rank[name]["moved"] and same_state(rank[name]["state"], rank[name]["moved_state"]), name


def test_the_codecs_that_sum_in_two_stages_say_so_in_their_registration():
    assert [n for n in BUILT if needs_topology(make_codec(n))] == ["fp8", "fp8-direct", "topk-nodes"]
