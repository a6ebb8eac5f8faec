"""The membership the loop reads instead of the world group: its collectives reach its members alone, its first
member gathers, and a fixed group commits every round."""

import torch
import torch.distributed as dist

from scalesgd.comm.wire.groups import own_group
from scalesgd.comm.wire.membership import Membership
from tests.spawn_util import run_workers


def collectives(rank, world):
    subgroup = own_group([1, 2])  # every rank creates it; ranks 1 and 2 are its members, rank 1 its first
    out = {"world": _use(Membership.world(), rank)}
    if rank in (1, 2):
        out["sub"] = _use(Membership(subgroup), rank)
    return out


def _use(members: Membership, rank: int) -> dict:
    summed = members.all_reduce(torch.tensor([float(rank)]))
    started = torch.tensor([float(rank)])
    members.all_reduce_started(started).wait()
    tensor = torch.tensor([float(rank)] * 2)
    gathered = members.gather(tensor)
    objects = members.gather_object({"rank": rank})
    everyone = members.all_gather_object(rank)
    shared = torch.tensor([float(rank)])
    members.broadcast(shared)
    members.barrier()
    return {"rank": members.rank, "size": members.size, "main": members.is_main, "sum": summed.item(), "started": started.item(),
            "gathered": [t.tolist() for t in gathered], "objects": objects, "everyone": everyone,
            "shared": shared.item(), "commits": members.should_commit(), "may_abort": members.may_abort}


def test_its_collectives_reach_its_members_and_its_first_member_gathers():
    results = run_workers(collectives, 3)
    for rank, out in enumerate(results):
        world = out["world"]
        assert (world["rank"], world["size"], world["main"]) == (rank, 3, rank == 0)
        assert world["sum"] == world["started"] == 3.0 and world["everyone"] == [0, 1, 2] and world["shared"] == 0.0
        assert world["gathered"] == ([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]] if rank == 0 else [])
        assert world["objects"] == ([{"rank": 0}, {"rank": 1}, {"rank": 2}] if rank == 0 else [])
        assert world["commits"] and not world["may_abort"]  # a fixed group takes every round
    for rank in (1, 2):
        sub = results[rank]["sub"]
        assert (sub["rank"], sub["size"], sub["main"]) == (rank - 1, 2, rank == 1)
        assert sub["sum"] == sub["started"] == 3.0 and sub["everyone"] == [1, 2] and sub["shared"] == 1.0  # rank 1 is its first
        assert sub["gathered"] == ([[1.0, 1.0], [2.0, 2.0]] if rank == 1 else [])
    assert "sub" not in results[0] and dist.is_available()
