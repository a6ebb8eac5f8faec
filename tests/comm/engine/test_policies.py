"""What the engines apply around any codec: the squared norms the noise scale is made of (this rank's gradient
before the exchange and the exchanged mean, whichever codec or hook carries the buckets), and dense first steps."""

import copy

import pytest
import torch
import torch.distributed as dist

from scalesgd.comm.codecs import Channel, make_codec
from scalesgd.comm.engine.driver import BucketDriver
from scalesgd.comm.engine.exchange import ExchangeSetup, build_exchange
from scalesgd.comm.engine.policies import DenseFirst, GradientNorms
from scalesgd.models import build_model
from tests.spawn_util import run_workers

PATHS = [("scalesgd", "fp32"), ("scalesgd", "topk"), ("scalesgd", "fp8-flat"),
         ("ddp", "fp32"), ("ddp", "fp16"), ("ddp", "topk")]  # DDP's own allreduce, PyTorch's hook, our hook


def counted_and_true(rank, world):
    out = {}
    for engine, codec in PATHS:
        torch.manual_seed(0)
        model = build_model("resnet8", 10, 3)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
        alone = copy.deepcopy(model)  # this rank's own gradient, with no exchange
        torch.nn.functional.cross_entropy(alone(x), y).backward()
        local_sq = sum(p.grad.double().square().sum() for p in alone.parameters())
        norms = GradientNorms()
        exchange = build_exchange(engine, model, torch.optim.SGD(model.parameters(), lr=0.0),
                                  ExchangeSetup(codec, norms=norms))
        torch.nn.functional.cross_entropy(exchange.model(x), y).backward()
        exchange.optimizer.step()
        mean_sq = sum(p.grad.double().square().sum() for p in model.parameters())
        out[engine, codec] = (exchange.pop_norms().cpu(), local_sq, mean_sq, exchange.pop_norms().cpu())
        exchange.close()
    return out


def test_every_engine_counts_the_local_and_the_exchanged_squared_norms():
    for result in run_workers(counted_and_true, 2):
        for path in PATHS:
            counted, local_sq, mean_sq, after = result[path]
            assert counted[0].item() == pytest.approx(local_sq.item(), rel=1e-5), path
            assert counted[1].item() == pytest.approx(mean_sq.item(), rel=1e-5), path
            assert counted[1] < counted[0], path  # averaging over ranks shrinks the norm
            assert torch.equal(after, torch.zeros(2, dtype=torch.float64)), path  # popping starts the next step


def dense_then_codec(rank, world):
    params = [torch.zeros(1000)]
    channel = Channel(dist.group.WORLD, world)
    driver = BucketDriver(make_codec("fp8-flat"), channel, dense_steps=3)
    view = driver.view(0, params, [0], 1000)
    gen = torch.Generator().manual_seed(rank)
    exact, resumed = [], None
    for step in range(5):
        g = torch.randn(1000, generator=gen)
        mean = g.clone()
        dist.all_reduce(mean)
        mean /= world
        out = g.clone()
        driver.exchange(out, view)
        exact.append(torch.equal(out, mean))
        if step == 1:
            resumed = BucketDriver(make_codec("fp8-flat"), channel, dense_steps=3)
            resumed.load_state_dict(driver.state_dict())
    return exact, resumed.state_dict()["done"], driver.state_dict()["inner"] == driver.codec.state_dict()


def test_dense_first_steps_are_the_exact_mean_then_the_codec_compresses_and_the_count_resumes():
    for exact, done, wrapped in run_workers(dense_then_codec, 2):
        assert exact == [True, True, True, False, False]
        assert done == {0: 2}  # a resumed driver knows how many dense steps are behind each parameter
        assert wrapped  # the codec's own state, beside the policy's count


def test_dense_first_counts_each_parameter_so_a_regrouped_bucket_keeps_its_count():
    policy = DenseFirst(2)
    assert [policy.dense((0, 1)), policy.dense((0, 1))] == [True, True]
    assert policy.dense((1, 2)) is False  # parameter 1 had its two dense steps, whatever bucket it is in now
    assert policy.dense((3,)) is True  # a parameter never seen starts at its first step
