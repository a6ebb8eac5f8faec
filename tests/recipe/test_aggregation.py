"""Remark 3: a loss normalised by the global batch makes k workers' mean gradient the global batch's (gloo)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scalesgd.data import GlobalBatchSampler
from scalesgd.recipe import global_batch_loss
from tests.spawn_util import run_workers

SAMPLES, GLOBAL_BATCH = 23, 10  # the last global batch holds 3 samples: ranks hold unequal counts


def bn_free_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(SAMPLES, 1, 8, 8, generator=g), torch.randint(0, 5, (SAMPLES,), generator=g)


def ddp_step_grads(rank, world):
    x, y = data()
    model = DistributedDataParallel(bn_free_model())
    sampler = GlobalBatchSampler(SAMPLES, GLOBAL_BATCH, world, rank, seed=3)
    sampler.set_epoch(0)
    grads, steps = [], []
    for i, idx in enumerate(sampler):
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum")
        global_batch_loss(loss, world, sampler.global_counts(i)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        everyone = [None] * world
        dist.all_gather_object(everyone, list(idx))
        steps.append(sorted(j for part in everyone for j in part))
    return grads, steps


def test_averaged_gradient_of_k_workers_equals_one_process_gradient_over_the_global_batch():
    x, y = data()
    results = run_workers(ddp_step_grads, 3)
    grads0, steps = results[0]
    assert sum(map(len, steps)) == SAMPLES and GLOBAL_BATCH % 3, "ranks must hold unequal counts"
    for rank_grads, _ in results[1:]:
        for a, b in zip(rank_grads, grads0):
            assert all(torch.equal(u, v) for u, v in zip(a, b))
    for step, step_grads in zip(steps, grads0):
        model = bn_free_model()
        nn.functional.cross_entropy(model(x[step]), y[step]).backward()  # mean over the global batch
        for p, g in zip(model.parameters(), step_grads):
            assert torch.allclose(p.grad, g, rtol=1e-6, atol=1e-7)
