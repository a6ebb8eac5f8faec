"""The one exchange object: the same questions answered by DDP (with or without a hook) and by our engine."""

import copy

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import CODECS, CodecSettings, TopkOptions
from scalesgd.comm.codecs.registry import CROSS_NODE_SHARDS, SHARDED_ENGINE
from scalesgd.comm.engine.exchange import (
    ENGINES,
    DdpExchange,
    EngineExchange,
    ExchangeSetup,
    build_exchange,
    engine_named,
)
from scalesgd.comm.engine.fsdp import FsdpExchange, shard_model
from scalesgd.comm.engine.optimizer import DistributedOptimizer, IterationStats
from scalesgd.config import TrainConfig
from scalesgd.errors import Renamed
from scalesgd.models import build_model
from scalesgd.sim.modes import parse_mode
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
    assert "flat" in first[("scalesgd", "topk")]["codec_state"]  # residuals, per rank
    assert first[("ddp", "powersgd")]["bucket_cap"] == 25 * 1024 * 1024  # DDP's default buckets, on gloo too


def test_own_groups_and_engine_compatibility_come_from_the_registry():
    assert set(ENGINES) == {"ddp", "scalesgd", "scalesgd-fsdp", "fsdp2"}
    assert [name for name, entry in CODECS.items() if entry.runs_on("fsdp2")] == ["fp32", "fp16", "bf16"]
    for site in (SHARDED_ENGINE, CROSS_NODE_SHARDS):  # each unit's gradients (or shard) one bucket: not regrouped
        assert [name for name, entry in CODECS.items() if not entry.runs_on(site)] == ["powersgd", "topk-global",
                                                                                       "lags"]
    assert [name for name, entry in CODECS.items() if entry.scatters] == [  # sums that end in the shards
        "fp32", "fp16", "bf16", "fp8", "fp8-direct", "fp8-flat"]
    assert not FsdpExchange.uses_own_group(CODECS["fp16"])  # the reduce-scatter runs in FSDP's mesh
    assert EngineExchange.uses_own_group(CODECS["fp16"])
    assert not DdpExchange.uses_own_group(CODECS["fp16"]) and DdpExchange.uses_own_group(CODECS["fp8"])
    with pytest.raises(ValueError, match="codec 'lags' does not run on engine 'scalesgd-fsdp'"):
        build_exchange("scalesgd-fsdp", torch.nn.Linear(2, 2), None, ExchangeSetup("lags"))
    with pytest.raises(ValueError, match="takes a model sharded by shard_model"):
        build_exchange("scalesgd-fsdp", torch.nn.Linear(2, 2), None, ExchangeSetup("fp16"))
    with pytest.raises(ValueError, match="precision 'fp16': the sharded engine computes in fp32 or bf16"):
        shard_model(torch.nn.Linear(2, 2), precision="fp16")
    with pytest.raises(ValueError, match="codec 'powersgd' does not run on engine 'scalesgd'"):
        build_exchange("scalesgd", torch.nn.Linear(2, 2), None, ExchangeSetup("powersgd"))


NON_FINITE_CASES = [("ddp", "fp8"), ("ddp", "fp16"), ("ddp", "topk"), ("scalesgd", "fp8"), ("scalesgd", "fp8-flat"),
                    ("scalesgd", "bf16"), ("scalesgd", "topk"), ("scalesgd", "fp32")]


def batch(rank, step=0):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)


def fp16_step(exchange, rank, step):
    """One step in the exchange's own precision; whether it stepped."""
    x, y = batch(rank, step)
    with exchange.autocast():
        loss = torch.nn.functional.cross_entropy(exchange.model(x), y)
    exchange.backward(loss)
    stepped = exchange.step()
    exchange.optimizer.zero_grad(set_to_none=True)
    return stepped


def inf_on_one_rank(rank, world):
    """A clean fp16 step, then an inf in rank 1's gradient of one tensor: every rank's exchanged gradient of it is
    non-finite, the exchange's GradScaler skips the step on every rank, and the codec's state stays as it was."""
    out = {}
    for engine, codec in NON_FINITE_CASES:
        torch.manual_seed(0)
        model = build_model("resnet8", 10, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        exchange = build_exchange(engine, model, optimizer, ExchangeSetup(codec, precision="fp16"))
        assert fp16_step(exchange, rank, 0)
        poisoned = model.fc.weight
        if rank == 1:
            poisoned.register_hook(lambda g: g + float("inf"))
        before, scale = poisoned.detach().clone(), exchange.scaler.get_scale()
        state = copy.deepcopy(exchange.state_dict()["codec"])  # tensors change in place
        stepped = fp16_step(exchange, rank, 1)
        after = exchange.state_dict()["codec"]
        out[(engine, codec)] = (stepped, torch.equal(poisoned.detach(), before), exchange.scaler.get_scale() / scale,
                                same_state(state, after))
        exchange.close()
    return out


def same_state(a, b) -> bool:
    """Whether two codec states hold equal values (tensors bit-equal, NaN equal to NaN)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a.nan_to_num(), b.nan_to_num())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same_state, a, b))
    return a == b


def test_an_fp16_overflow_on_one_rank_skips_the_step_and_the_codec_update_on_every_rank():
    for ranks in run_workers(inf_on_one_rank, 2):
        for case, (stepped, unchanged, scale_ratio, same) in ranks.items():
            assert not stepped and unchanged and scale_ratio == 0.5, case  # skipped; the scale halved
            assert same, case  # residuals, ranges, counts: as before the skipped step


def residual_norms(rank, world):
    """Top-k's residuals after one step in fp32 and in fp16 (loss scaled by 65536)."""
    norms = {}
    for precision in ("fp32", "fp16"):
        torch.manual_seed(0)
        model = build_model("resnet8", 10, 3)
        exchange = build_exchange("scalesgd", model, torch.optim.SGD(model.parameters(), lr=0.1),
                                  ExchangeSetup("topk", CodecSettings(TopkOptions(density=0.01)), precision=precision))
        fp16_step(exchange, rank, 0)
        residuals = [p["residual"] for p in exchange.state_dict()["codec"]["flat"]["params"].values()]
        norms[precision] = torch.cat([r.flatten() for r in residuals]).norm().item()
        exchange.close()
    return norms


def test_a_codec_that_keeps_gradients_keeps_them_without_fp16s_loss_scale():
    for norms in run_workers(residual_norms, 2):
        assert norms["fp32"] > 0 and abs(norms["fp16"] / norms["fp32"] - 1) < 0.05, norms  # not 65536 times


def every_codec_in_mixed_precision(rank, world):
    """Two steps of every codec of our engine under bf16 and fp16 autocast: the weights each rank ends with."""
    out = {}
    for codec in [name for name, entry in CODECS.items() if entry.runs_on("scalesgd") and entry.optimizer is None]:
        for precision in ("bf16", "fp16"):
            torch.manual_seed(0)
            model = build_model("resnet8", 10, 3)
            before = torch.cat([p.detach().flatten() for p in model.parameters()])
            exchange = build_exchange("scalesgd", model, torch.optim.SGD(model.parameters(), lr=0.1),
                                      ExchangeSetup(codec, CodecSettings(TopkOptions(density=0.1)), precision=precision))
            stepped = [fp16_step(exchange, rank, step) for step in range(2)]
            after = torch.cat([p.detach().flatten() for p in model.parameters()])
            out[(codec, precision)] = (stepped, after, bool(torch.isfinite(after).all()), not torch.equal(after, before))
            exchange.close()
    return out


def test_every_codec_of_our_engine_trains_under_bf16_and_fp16_autocast():
    ranks = run_workers(every_codec_in_mixed_precision, 2)
    for case, (stepped, after, finite, moved) in ranks[0].items():
        assert all(stepped) and finite and moved, case
        assert torch.equal(after, ranks[1][case][1]), case  # every rank steps alike


def test_an_engines_earlier_name_still_works_and_says_its_name_now():
    with pytest.warns(Renamed, match="`engine` fsdp is now scalesgd-fsdp"):
        assert engine_named("fsdp") == SHARDED_ENGINE
    with pytest.warns(Renamed):
        mode = parse_mode("fsdp:node-fp8")
    assert (mode.engine, mode.shard, mode.codec) == (SHARDED_ENGINE, "node", "fp8")
    assert engine_named("fsdp2") == "fsdp2" and engine_named("fsdp", warn=False) == SHARDED_ENGINE
    assert TrainConfig.from_dict({"engine": "fsdp"}).exchange.engine == SHARDED_ENGINE  # an old run's config.json
