"""Every allreduce algorithm against `dist.all_reduce` on real gloo workers, one spawn per world size."""

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.wire.collectives import (
    ALGORITHMS,
    allreduce,
    ring_allgather_steps,
    ring_allreduce_steps,
    ring_reduce_scatter_steps,
)
from scalesgd.comm.wire.topology import Topology
from tests.spawn_util import run_workers

OURS = ("ring", "halving_doubling", "native")


def _compare(tag, got, expected, exact, failures):
    if exact:
        ok = torch.equal(got, expected)
    else:
        ok = torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    if not ok:
        err = (got.double() - expected.double()).abs().max().item() if got.numel() else "shape"
        failures.append(f"{tag}: max error {err}")


def _case(rank, n, kind, dtype=torch.float32):
    """This rank's input: integer-valued (sums are exact in every dtype) or random normal."""
    g = torch.Generator().manual_seed(7919 * rank + n)
    if kind == "int":
        return torch.randint(-8, 9, (n,), generator=g).to(dtype)
    return torch.randn(n, generator=g, dtype=dtype)


def check_world(rank, world, algorithms, procs_per_node):
    """Run every case on this rank; return the list of failures (empty when all agree)."""
    failures = []
    cases = [(a, None) for a in algorithms]
    cases += [("hierarchical", k) for k in procs_per_node if world % k == 0]
    cases += [("hierarchical", None)] if procs_per_node else []  # Topology.from_env(): one node here
    lengths = sorted({0, 1, 2, world - 1, world + 1, 1000, 1031})
    for alg, ppn in cases:
        topo = Topology(world, rank, ppn) if ppn else None
        name = f"{alg}" + (f"[ppn={ppn}]" if ppn else "[env]" if alg == "hierarchical" else "")

        def run(x, tag, exact):
            expected = x.clone()
            dist.all_reduce(expected)
            got = x.clone()
            sent = allreduce(got, alg, topology=topo)
            _compare(f"{name} {tag}", got, expected, exact, failures)
            return sent

        for n in lengths:
            sent = run(_case(rank, n, "int"), f"n={n} int", exact=True)
            nbytes = 4 * n
            if world == 1 and sent != 0:
                failures.append(f"{name} n={n}: world 1 sent {sent} bytes")
            if alg in ("ring", "native") and abs(sent - 2 * (world - 1) * nbytes / world) > 2 * 4:
                failures.append(f"{name} n={n}: sent {sent} bytes, ring estimate {2 * (world - 1) * nbytes / world}")
            run(_case(rank, n, "float"), f"n={n} float", exact=False)
        for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int64):
            run(_case(rank, 1031, "int", dtype), f"{dtype} int", exact=True)
        big = torch.randint(-2**40, 2**40, (97,), generator=torch.Generator().manual_seed(rank))
        run(big, "int64 large", exact=True)
        run(torch.tensor(float(rank + 1)), "0-d", exact=True)
        # non-contiguous input: the result must land in the caller's tensor, strides kept
        base = _case(rank, 37 * 29, "int").view(37, 29)
        x, expected = base.t(), base.t().clone()
        dist.all_reduce(expected)
        strides = x.stride()
        allreduce(x, alg, topology=topo)
        _compare(f"{name} non-contiguous", x, expected, True, failures)
        if x.stride() != strides or x.data_ptr() != base.data_ptr():
            failures.append(f"{name} non-contiguous: result not written into the input")
        strided = _case(rank, 2 * 515, "float")[::2]
        expected = strided.clone()
        dist.all_reduce(expected)
        allreduce(strided, alg, topology=topo)
        _compare(f"{name} strided", strided, expected, False, failures)
    if world >= 4:
        check_subgroup(rank, world, [a for a in algorithms if a != "hierarchical"], failures)
    return failures


def check_subgroup(rank, world, algorithms, failures):
    """On a subgroup whose group ranks differ from global ranks; non-members are left untouched."""
    group = dist.new_group([world - 1, 0, 2])
    member = rank in (0, 2, world - 1)
    for alg in algorithms:
        for n in (0, 1, 2, 4, 1031):
            x = _case(rank, n, "int")
            expected = x.clone()
            if member:
                dist.all_reduce(expected, group=group)
            got = x.clone()
            sent = allreduce(got, alg, group=group)
            _compare(f"{alg} subgroup n={n}", got, expected, True, failures)
            if not member and sent:
                failures.append(f"{alg} subgroup: non-member rank {rank} sent {sent} bytes")


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6])
def test_every_algorithm_matches_dist_all_reduce(world):
    results = run_workers(check_world, world, OURS, (1, 2, 3))
    assert [f for rank_failures in results for f in rank_failures] == []


def test_ring_and_halving_doubling_on_eight_workers():
    results = run_workers(check_world, 8, ("ring", "halving_doubling"), ())
    assert [f for rank_failures in results for f in rank_failures] == []


def test_unknown_algorithm_lists_the_choices():
    with pytest.raises(ValueError) as err:
        allreduce(torch.zeros(3), "butterfly")
    assert all(a in str(err.value) for a in ALGORITHMS)


class _Posted:
    """A process group that records the point-to-point calls made on it, in order (each one done at once)."""

    def __init__(self):
        self.calls = []

    def recv(self, tensors, src, tag):
        self.calls.append(("recv", src))
        return _Done()

    def send(self, tensors, dst, tag):
        self.calls.append(("send", dst))
        return _Done()


class _Done:
    def wait(self):
        return True


@pytest.mark.parametrize("phase", ["reduce-scatter", "allgather"])
def test_a_ring_posts_each_receive_a_step_ahead_so_gloo_sends_it_without_a_round_trip(phase):
    group, chunks = _Posted(), list(torch.zeros(8).chunk(4))
    steps = (ring_reduce_scatter_steps(chunks, 1, [0, 1, 2, 3], group, torch.zeros(2)) if phase == "reduce-scatter"
             else ring_allgather_steps(chunks, 1, [0, 1, 2, 3], group))
    waited = []
    with pytest.raises(StopIteration):
        while True:
            waited.append(len(next(steps) if not waited else steps.send(None)))
            assert group.calls.count(("recv", 0)) == min(len(waited) + 1, 3), group.calls  # the next step's too
    # 3 steps: each waits for its receive and its send; a step's receive was posted before the step before it waited
    assert waited == [2, 2, 2] and group.calls.count(("send", 2)) == 3
    assert group.calls[:3] == [("recv", 0), ("recv", 0), ("send", 2)]


def test_a_ring_allreduce_posts_the_allgathers_first_receive_while_its_reduce_scatter_ends(monkeypatch):
    import scalesgd.comm.wire.collectives as collectives

    group = _Posted()
    monkeypatch.setattr(collectives, "ring_members", lambda _group: (1, [0, 1, 2, 3]))
    steps, received = ring_allreduce_steps(torch.zeros(8), group), []
    with pytest.raises(StopIteration):
        while True:
            next(steps) if not received else steps.send(None)
            received.append(group.calls.count(("recv", 0)))
    assert received == [2, 3, 4, 5, 6, 6]  # at the reduce-scatter's last step (3rd) the allgather's first is posted
