"""The squared norms the noise scale is made of, as each engine counts them: this rank's gradient before the
exchange and the exchanged mean, whichever codec or hook carries the buckets."""

import copy

import pytest
import torch

from scalesgd.comm.engine.exchange import ExchangeSetup, build_exchange
from scalesgd.comm.engine.policies import GradientNorms
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


def test_a_measured_codec_is_its_inner_codec_to_everything_else_and_copies():
    from scalesgd.comm.codecs import make_codec
    from scalesgd.comm.engine.policies import MeasuredCodec

    measured = MeasuredCodec(make_codec("topk"), GradientNorms())
    assert (measured.name, measured.density, measured.encode_in_backward) == ("topk", 0.1, True)
    again = copy.copy(measured)  # looks up __setstate__ before its fields exist
    assert again.inner is measured.inner and again.state_dict() == {"buckets": {}}
