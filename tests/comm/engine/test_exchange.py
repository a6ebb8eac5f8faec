"""The one exchange object: the same questions answered by DDP (with or without a hook) and by our engine."""

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import CODECS, CodecSettings, TopkOptions
from scalesgd.comm.engine.exchange import ENGINES, DdpExchange, EngineExchange, ExchangeSetup, build_exchange
from scalesgd.comm.engine.optimizer import DistributedOptimizer, IterationStats
from scalesgd.models import build_model
from tests.spawn_util import run_workers

CASES = [("ddp", "fp32"), ("ddp", "fp16"), ("ddp", "powersgd"), ("ddp", "fp8-flat"), ("scalesgd", "fp32"),
         ("scalesgd", "topk")]


def one_step(exchange, rank):
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)
    torch.nn.functional.cross_entropy(exchange.model(x), y).backward()
    exchange.optimizer.step()
    exchange.optimizer.zero_grad(set_to_none=True)


def every_engine(rank, world):
    out = {}
    for engine, codec in CASES:
        torch.manual_seed(0)
        model = build_model("resnet8", 10, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        exchange = build_exchange(engine, model, optimizer, ExchangeSetup(codec, CodecSettings(TopkOptions(density=0.5))))
        one_step(exchange, rank)
        stats = exchange.stats()
        state = exchange.state_dict()
        exchange.load_state_dict(state)
        one_step(exchange, rank)
        out[(engine, codec)] = {
            "kind": type(exchange).__name__, "wraps_ddp": isinstance(exchange.model, DistributedDataParallel),
            "optimizer_is_engine": isinstance(exchange.optimizer, DistributedOptimizer),
            "stats": stats, "codec_state": state["codec"], "has_plan": exchange.plan is not None,
            "bucket_cap": getattr(exchange.model, "bucket_bytes_cap", None),
            "weights": torch.cat([p.detach().flatten() for p in model.parameters()])}
        exchange.close()
    return out


def test_both_engines_answer_the_same_questions():
    ranks = run_workers(every_engine, 2)
    first = ranks[0]
    for case, seen in first.items():
        engine, codec = case
        assert torch.equal(seen["weights"], ranks[1][case]["weights"]), case  # every rank steps alike
        if engine == "ddp":
            assert seen["kind"] == "DdpExchange" and seen["wraps_ddp"] and not seen["has_plan"]
            assert seen["stats"] is None  # DDP does not say where its exchange time went
        else:
            assert seen["kind"] == "EngineExchange" and seen["optimizer_is_engine"] and seen["has_plan"]
            assert isinstance(seen["stats"], IterationStats) and seen["stats"].bytes_sent > 0
    assert first[("ddp", "fp32")]["codec_state"] is None and first[("ddp", "fp16")]["codec_state"] is None
    assert "tensors" in first[("ddp", "fp8-flat")]["codec_state"]  # our hook's codec: its ranges
    assert "buckets" in first[("scalesgd", "topk")]["codec_state"]  # residuals, per rank
    assert first[("ddp", "powersgd")]["bucket_cap"] == 25 * 1024 * 1024  # DDP's default buckets, on gloo too


def test_own_groups_and_engine_compatibility_come_from_the_registry():
    assert set(ENGINES) == {"ddp", "scalesgd"}
    assert EngineExchange.uses_own_group(CODECS["fp16"])
    assert not DdpExchange.uses_own_group(CODECS["fp16"]) and DdpExchange.uses_own_group(CODECS["fp8"])
    with pytest.raises(ValueError, match="codec 'powersgd' does not run on engine 'scalesgd'"):
        build_exchange("scalesgd", torch.nn.Linear(2, 2), None, ExchangeSetup("powersgd"))


NON_FINITE_CASES = [("ddp", "fp8"), ("ddp", "fp16"), ("scalesgd", "fp8"), ("scalesgd", "fp8-flat"),
                    ("scalesgd", "bf16"), ("scalesgd", "topk"), ("scalesgd", "fp32")]


def inf_on_one_rank(rank, world):
    """An inf in rank 1's gradient of one tensor: every rank's exchanged gradient of it is non-finite, and
    GradScaler skips the step on every rank."""
    out = {}
    for engine, codec in NON_FINITE_CASES:
        torch.manual_seed(0)
        model = build_model("resnet8", 10, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        exchange = build_exchange(engine, model, optimizer, ExchangeSetup(codec))
        poisoned = model.fc.weight
        if rank == 1:
            poisoned.register_hook(lambda g: g + float("inf"))
        before = poisoned.detach().clone()
        scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)
        scaler.scale(torch.nn.functional.cross_entropy(exchange.model(x), y)).backward()
        if isinstance(exchange.optimizer, DistributedOptimizer):
            exchange.optimizer.synchronize()  # the mean gradient in .grad before GradScaler looks at it
        finite = bool(torch.isfinite(poisoned.grad).all())
        scaler.step(exchange.optimizer)
        scaler.update()
        out[(engine, codec)] = (finite, torch.equal(poisoned.detach(), before), scaler.get_scale())
        exchange.close()
    return out


def test_a_non_finite_gradient_on_one_rank_is_seen_on_every_rank_and_the_step_skipped():
    for ranks in run_workers(inf_on_one_rank, 2):
        for case, (finite, unchanged, scale) in ranks.items():
            assert not finite, case
            assert unchanged and scale == 2.0, case  # GradScaler found the inf, skipped, halved its scale
