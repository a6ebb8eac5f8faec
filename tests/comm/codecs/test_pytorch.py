"""PyTorch's hooks as the baselines: PowerSGD in DDP's several buckets on gloo, its chains issued in one order."""

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import CodecSettings, LowrankOptions
from scalesgd.comm.codecs.pytorch import POWERSGD_START_ITER, InOrder, powersgd
from tests.spawn_util import run_workers

ITERATIONS = POWERSGD_START_ITER + 8


def powersgd_in_buckets(rank, world):
    """PowerSGD past its start on a model DDP cuts into several small buckets; weights, buckets and losses."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)], nn.Linear(256, 10))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.3)
    hook = powersgd(on_cuda=False)
    ddp.register_comm_hook(hook.state, hook.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
    losses = []
    for _ in range(ITERATIONS):
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
    hook.close()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), buckets, losses, type(hook.state)


def test_powersgd_runs_in_several_buckets_on_gloo_and_every_rank_steps_alike():
    ranks = run_workers(powersgd_in_buckets, 3)
    weights, buckets, losses, state = ranks[0]
    assert state is InOrder and buckets >= 3
    assert all(torch.equal(weights, other[0]) for other in ranks[1:])
    assert losses[-1] < losses[POWERSGD_START_ITER]  # the compressed steps still descend


def test_powersgd_takes_the_lowrank_familys_rank_and_compression_rule_as_lowrank_does():
    default = powersgd(on_cuda=False).state.state
    assert (default.matrix_approximation_rank, default.min_compression_rate) == (4, 2)
    given = powersgd(False, CodecSettings(LowrankOptions(rank=2, min_rate=3.0))).state.state
    assert (given.matrix_approximation_rank, given.min_compression_rate) == (2, 3.0)
