from types import SimpleNamespace

import pytest
import torch

from scalesgd.comm.codecs.fp8 import kernels as fp8
from scalesgd.comm.codecs.fp8.sums import first_sum_ranks, flat_sum, two_stage_sum
from scalesgd.comm.wire.topology import Topology
from tests.spawn_util import run_workers

LENGTHS = (1, 7, 1001, 65_537)
BITS = 2  # e5m2 mantissa bits: a rounding is off by at most 2^-3 of the value


def rank_values(rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, generator=g) * 10.0 ** torch.randint(-3, 3, (n,), generator=g)


def sums(rank, world, procs_per_node, two_stage):
    groups = Topology(world, rank, procs_per_node).groups()
    out = {}
    for n in LENGTHS:
        x = rank_values(rank, n)
        spread = first_sum_ranks(groups) if two_stage else world
        scale = 50.0 / spread  # |x| < 500: every partial sum stays below 57344
        h = fp8.encode(x, scale)
        if two_stage:
            two_stage_sum(h, groups)
        else:
            flat_sum(h)
        out[n] = fp8.decode(h, 50.0)
    return out


@pytest.mark.parametrize("world,procs_per_node,two_stage",
                         [(4, 2, True), (4, 1, True), (2, 2, True), (3, 1, False), (4, 2, False)])
def test_fp8_sums_give_the_mean_within_the_rounding_bound_and_the_same_bytes_everywhere(
        world, procs_per_node, two_stage):
    results = run_workers(sums, world, procs_per_node, two_stage)
    for n in LENGTHS:
        xs = torch.stack([rank_values(r, n) for r in range(world)])
        mean = xs.mean(0)
        # roundings: each input once, then every partial sum once (at most world of them)
        bound = 2.0 ** -(BITS + 1) * (xs.abs().mean(0) * (world + 1)) + 2e-5
        assert ((results[0][n] - mean).abs() <= bound).all(), n
        for r in range(1, world):
            assert torch.equal(results[r][n], results[0][n]), (n, r)


def test_sums_saturate_instead_of_overflowing():
    results = run_workers(_saturate, 4)
    for out in results:
        assert out.tolist() == [57344.0, -57344.0]


def test_the_first_sum_adds_a_node_s_ranks_or_all_when_they_are_alone():
    assert first_sum_ranks(SimpleNamespace(topology=Topology(8, 0, 4))) == 4
    assert first_sum_ranks(SimpleNamespace(topology=Topology(6, 0, 1))) == 6


def _saturate(rank, world):
    groups = Topology(world, rank, 2).groups()
    h = fp8.encode(torch.tensor([57344.0, -57344.0]))
    two_stage_sum(h, groups)
    return fp8.decode(h)
