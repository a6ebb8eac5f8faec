"""The sharded engine: FSDP2 steps the GPT as DDP does, accumulation included; its reduce-scatter's bytes are the
shards' on the codec's wire; a checkpoint of whole tensors resumes a sharded run exactly."""

import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from scalesgd.comm.codecs import CodecSettings, TopkOptions
from scalesgd.comm.engine.exchange import ExchangeSetup, build_exchange
from scalesgd.comm.engine.fsdp import Fsdp2Exchange, node_mesh, shard_model
from scalesgd.comm.wire.topology import Topology, build_groups
from scalesgd.models import MODELS, GPT
from scalesgd.models.gpt import GptOptions
from scalesgd.optim import LAMB, LARS
from scalesgd.optim.onebit_adam import EarlyFreezeWarning, OneBitAdam
from scalesgd.train import memory
from tests.spawn_util import run_workers

VOCAB, STEPS, MICRO = 64, 3, 2


def gpt():
    torch.manual_seed(0)
    return GPT(VOCAB, GptOptions(layers=2, heads=2, width=16, block=8))


def batches(rank: int):
    g = torch.Generator().manual_seed(rank)
    return [torch.randint(0, VOCAB, (2, 9), generator=g) for _ in range(STEPS * MICRO)]


def train(exchange, data, steps=STEPS):
    """`steps` steps of `MICRO` micro-batches each, the ones before the last in `no_sync`."""
    for step in range(steps):
        for micro in range(MICRO):
            tokens = data[step * MICRO + micro]
            sync = exchange.no_sync() if micro < MICRO - 1 else torch.enable_grad()
            with sync:
                logits = exchange.model(tokens[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()) / MICRO
                exchange.backward(loss)
        exchange.step()
        exchange.optimizer.zero_grad(set_to_none=True)


def shard_gpt():
    model = gpt()
    return shard_model(model, MODELS["gpt"].shard_units(model))


def fsdp2_gpt(codec, groups=None):
    model = gpt()
    return Fsdp2Exchange.shard(model, MODELS["gpt"].shard_units(model), "fp32", codec, groups)


def whole(exchange, model) -> dict:
    return {k: v.clone() for k, v in exchange.model_state(model).items()}


def sharded_against_ddp(rank, world, folder):
    data = batches(rank)
    out = {}
    for engine, codec in (("ddp", "fp32"), ("scalesgd", "bf16")):  # the unsharded runs
        reference = gpt()
        unsharded = build_exchange(engine, reference, torch.optim.AdamW(reference.parameters(), lr=1e-2),
                                   ExchangeSetup(codec, CodecSettings()))
        train(unsharded, data)
        unsharded.close()
        out[engine] = {k: v.clone() for k, v in reference.state_dict().items()}
        out[engine, "held"] = memory.state_bytes(unsharded.optimizer)
    for codec in ("fp32", "bf16"):
        model = shard_gpt()
        exchange = build_exchange("scalesgd-fsdp", model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                  ExchangeSetup(codec, CodecSettings()))
        exchange.stats()
        train(exchange, data)
        out[codec] = {"state": whole(exchange, model), "sent": exchange.stats().bytes_sent,
                      "local": sum(p.to_local().numel() for p in model.parameters()),
                      "held": memory.state_bytes(exchange.optimizer)}
        model = fsdp2_gpt(codec)  # FSDP2's own reduce-scatter in the codec's dtype
        own = build_exchange("fsdp2", model, torch.optim.AdamW(model.parameters(), lr=1e-2), ExchangeSetup(codec))
        train(own, data)
        out["fsdp2", codec] = (whole(own, model), own.stats())
        if codec == "fp32":  # a checkpoint after 2 steps resumes into a fresh sharded run: the same third step
            again = shard_gpt()
            resumed = build_exchange("scalesgd-fsdp", again, torch.optim.AdamW(again.parameters(), lr=1e-2),
                                     ExchangeSetup())
            first = shard_gpt()
            partway = build_exchange("scalesgd-fsdp", first, torch.optim.AdamW(first.parameters(), lr=1e-2),
                                     ExchangeSetup())
            train(partway, data, steps=2)
            dcp.save(partway.sharded_state(first), checkpoint_id=folder)  # each rank writes its own shards
            out["saved"] = (whole(partway, first), partway.optimizer_state())
            resumed.load_sharded_state(again, folder)
            train(resumed, data[2 * MICRO:], steps=1)
            out["resumed"] = whole(resumed, again)
    sgd = lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9)  # noqa: E731  (AdamW blows up rounding)
    # fp8 relative to the weights
    for engine, codec in (("ddp", "fp32"), ("scalesgd", "fp8-flat"), ("scalesgd-fsdp", "fp8")):
        model = shard_gpt() if engine == "scalesgd-fsdp" else gpt()
        exchange = build_exchange(engine, model, sgd(model.parameters()), ExchangeSetup(codec))
        train(exchange, data)
        out["sgd", codec] = (whole(exchange, model), getattr(exchange.stats(), "bytes_sent", None))
        exchange.close()
    return out


def test_sharded_adamw_steps_the_gpt_as_ddp_does_and_sends_the_shards_on_the_codecs_wire(tmp_path):
    ranks = run_workers(sharded_against_ddp, 2, str(tmp_path / "shards"))
    first = ranks[0]
    reference, fp32, bf16 = first["ddp"], first["fp32"]["state"], first["bf16"]["state"]
    assert ranks[1]["fp32"]["state"] == {}  # the whole tensors are gathered to rank 0 alone
    assert fp32.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.allclose(fp32[name], tensor, rtol=0, atol=1e-6), name
        assert torch.allclose(first["resumed"][name], fp32[name], rtol=0, atol=1e-6), name
    for name, tensor in first["scalesgd"].items():  # our engine's bf16 wire: the same roundings, sharded or not
        assert torch.allclose(bf16[name], tensor, rtol=0, atol=1e-6), name
    assert max((bf16[k] - reference[k]).abs().max().item() for k in reference) > 1e-4  # and bf16 is no fp32
    own, counted = first["fsdp2", "fp32"]  # FSDP2's own reduce-scatter: in fp32 the same sums as ours
    assert counted is None and all(torch.allclose(own[k], fp32[k], rtol=0, atol=1e-6) for k in own)
    own, _ = first["fsdp2", "bf16"]  # in bf16 its own roundings (AdamW makes a step of a rounded near-zero
    apart = lambda a, b: max((a[k] - b[k]).abs().max().item() for k in b)  # gradient): as far from fp32 as ours
    assert 1e-5 < apart(own, fp32) < 3 * apart(bf16, fp32), (apart(own, fp32), apart(bf16, fp32))
    # a ring's reduce-scatter sends half of each rank's padded input at 2 ranks, once per step (not per micro-batch)
    parameters = sum(p.numel() for p in gpt().parameters())  # the tied head once; every dim 0 is even here
    assert first["fp32"]["sent"] == STEPS * 4 * parameters // 2 and first["bf16"]["sent"] == STEPS * 2 * parameters // 2
    assert first["fp32"]["local"] + ranks[1]["fp32"]["local"] == parameters  # each rank holds its half
    assert all(rank["fp32"]["held"] < 0.51 * first["ddp", "held"] for rank in ranks)  # of AdamW's moments too
    # fp8 in the reduce-scatter, relative to the gathered weights (a range for each parameter's shard): as close to
    # fp32 as our fp8 ring over whole gradients, for half its bytes (a reduce-scatter) and a quarter of fp32's (its
    # flags, a byte each parameter shard, travel to every rank: 6 % more on this tiny model)
    start, ddp = (torch.cat([s[k].flatten() for k in reference]) for s in (gpt().state_dict(), first["sgd", "fp32"][0]))
    off = {codec: (torch.cat([first["sgd", codec][0][k].flatten() for k in reference]) - ddp).norm() /
           (ddp - start).norm() for codec in ("fp8", "fp8-flat")}
    assert 1e-3 < off["fp8"] < 1.25 * off["fp8-flat"], off
    sent = first["sgd", "fp8"][1]
    assert STEPS * parameters // 2 < sent < 1.1 * STEPS * parameters // 2 < first["sgd", "fp8-flat"][1] / 1.8
    # the shards two ranks wrote, laid out again for four: the same whole parameters and AdamW state
    model, optimizer = run_workers(resharded, 4, str(tmp_path / "shards"))[0]
    saved_model, saved_optimizer = first["saved"]
    assert model.keys() == saved_model.keys() and all(torch.equal(model[k], saved_model[k]) for k in model)
    assert optimizer["state"].keys() == saved_optimizer["state"].keys()
    for name, moments in saved_optimizer["state"].items():
        assert all(torch.equal(optimizer["state"][name][k], v) for k, v in moments.items()), name


def resharded(rank, world, folder):
    model = shard_gpt()
    exchange = build_exchange("scalesgd-fsdp", model, torch.optim.AdamW(model.parameters(), lr=1e-2), ExchangeSetup())
    exchange.load_sharded_state(model, folder)
    return whole(exchange, model), exchange.optimizer_state()


def layerwise_sharded_and_not(rank, world):
    """LARS and LAMB (momentum, weight decay) a few steps on a model whose dims 0 do not divide by the ranks."""
    out = {}
    for name, build in (("lars", lambda ps: LARS(ps, lr=0.5, momentum=0.9, weight_decay=1e-2)),
                        ("lamb", lambda ps: LAMB(ps, lr=1e-2, weight_decay=1e-2))):
        for engine in ("ddp", "scalesgd-fsdp"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
            if engine == "scalesgd-fsdp":
                shard_model(model, [model[0]])
            exchange = build_exchange(engine, model, build(model.parameters()), ExchangeSetup())
            g = torch.Generator().manual_seed(rank)
            for _ in range(3):
                x, y = torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)
                exchange.backward(torch.nn.functional.mse_loss(exchange.model(x), y))
                exchange.step()
                exchange.optimizer.zero_grad(set_to_none=True)
            out[name, engine] = whole(exchange, model)
    return out


def test_lars_and_lamb_on_shards_take_each_layers_whole_norm_and_equal_the_unsharded_steps():
    first = run_workers(layerwise_sharded_and_not, 2)[0]
    for name in ("lars", "lamb"):
        unsharded, sharded = first[name, "ddp"], first[name, "scalesgd-fsdp"]
        assert sharded.keys() == unsharded.keys()
        for key, tensor in unsharded.items():  # a shard's own norm would scale each half differently
            assert torch.allclose(sharded[key], tensor, rtol=0, atol=1e-6), (name, key)


def clipped_on_every_engine(rank, world):
    out = {}
    for engine, clip in (("ddp", 0.0), ("ddp", 0.05), ("scalesgd", 0.05), ("scalesgd-fsdp", 0.05)):
        model = gpt()
        if engine == "scalesgd-fsdp":
            shard_model(model, MODELS["gpt"].shard_units(model))
        exchange = build_exchange(engine, model, torch.optim.SGD(model.parameters(), lr=1.0),
                                  ExchangeSetup(clip_norm=clip))
        train(exchange, batches(rank), steps=1)
        out[engine, clip] = whole(exchange, model)
        exchange.close()
    return out


def test_clipping_scales_the_mean_gradient_to_its_global_norm_on_every_engine():
    first = run_workers(clipped_on_every_engine, 2)[0]
    start, free = gpt().state_dict(), first["ddp", 0.0]
    moved = {k: (free[k] - start[k]) for k in start}  # the mean gradient itself (SGD at rate 1)
    norm = torch.linalg.vector_norm(torch.cat([v.flatten() for k, v in moved.items() if k != "head.weight"]))
    assert norm > 0.05  # so clipping at 0.05 acts
    for engine in ("ddp", "scalesgd", "scalesgd-fsdp"):
        clipped = first[engine, 0.05]
        for key in start:
            assert torch.allclose(clipped[key] - start[key], moved[key] * 0.05 / norm, rtol=0, atol=1e-6), (engine, key)


def hybrid_against_ddp(rank, world):
    """2 nodes × 2 ranks: shards within each node, the cross-node sum on the codec's wire (SGD: the key bias's
    gradient is rounding noise, which AdamW would blow up to a step; the sums here run in another order)."""
    groups = build_groups(Topology(world, rank, 2))
    data, out = batches(rank), {}
    reference = gpt()
    ddp = build_exchange("ddp", reference, torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9), ExchangeSetup())
    train(ddp, data)
    out["ddp"] = {k: v.clone() for k, v in reference.state_dict().items()}
    lars = lambda ps: LARS(ps, lr=0.5, momentum=0.9, weight_decay=1e-2)
    reference = gpt()
    ddp = build_exchange("ddp", reference, lars(reference.parameters()), ExchangeSetup())
    train(ddp, data)
    out["ddp", "lars"] = {k: v.clone() for k, v in reference.state_dict().items()}
    model = fsdp2_gpt("fp32", groups)  # FSDP2's own hybrid layout: a 2-D mesh, its all-reduce across nodes; LARS's
    own = build_exchange("fsdp2", model, lars(model.parameters()), ExchangeSetup())  # norms over its shard dim
    train(own, data)
    out["fsdp2"] = (whole(own, model), sum(p.to_local().numel() for p in model.parameters()))
    reference = gpt()
    ours = build_exchange("scalesgd", reference, torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9),
                          ExchangeSetup("fp8", topology=groups))
    train(ours, data)
    out["ours", "fp8"] = {k: v.clone() for k, v in reference.state_dict().items()}
    for codec in ("fp32", "bf16", "fp8", "onebit"):
        model = within_nodes(groups)
        with warnings.catch_warnings(category=EarlyFreezeWarning, action="ignore"):  # its variance: a step of SGD's
            optimizer = (OneBitAdam(model.parameters(), lr=1e-3, freeze_step=1) if codec == "onebit" else
                         torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
        exchange = build_exchange("scalesgd-fsdp", model, optimizer,
                                  ExchangeSetup(codec, CodecSettings(), topology=groups))
        train(exchange, data)
        out[codec] = {"state": whole(exchange, model), "sent": exchange.stats().bytes_sent,
                      "local": sum(p.to_local().numel() for p in model.parameters())}
    delivered = {}  # one backward's mean gradient shards: fp32's, top-k's, and top-k's residuals averaged over nodes
    for codec in ("fp32", "topk"):
        model = within_nodes(groups)
        exchange = build_exchange("scalesgd-fsdp", model, torch.optim.SGD(model.parameters(), lr=0.0), ExchangeSetup(
            codec, CodecSettings(TopkOptions(density=0.1)), topology=groups))
        logits = model(data[0][:, :-1])
        exchange.backward(torch.nn.functional.cross_entropy(logits.flatten(0, 1), data[0][:, 1:].flatten()))
        delivered[codec] = [p.grad.to_local().flatten() for p in model.parameters()]
    saved = exchange.state_dict()["codec"]
    residuals = saved["driver"]["flat"]["params"]
    again = build_exchange("scalesgd-fsdp", model, torch.optim.SGD(model.parameters(), lr=0.0), ExchangeSetup(
        "topk", CodecSettings(TopkOptions(density=0.1)), topology=groups))
    again.load_state_dict({"codec": {**saved, "layout": [1 - rank % 2, 2, 4]}})  # the other shards': not this rank's
    out["other shards"] = again.state_dict()["codec"]["driver"]["flat"]["params"]
    again.load_state_dict({"codec": saved})
    loaded = again.state_dict()["codec"]["driver"]["flat"]["params"]
    out["same shards"] = loaded.keys() == residuals.keys() and all(
        torch.equal(loaded[k]["residual"], residuals[k]["residual"]) for k in residuals)
    delivered["residual"] = []
    for key, shard in enumerate(delivered["topk"]):
        residual = residuals[key]["residual"][:shard.numel()].clone()  # the padded shard's first elements are its own
        dist.all_reduce(residual, group=groups.cross_group)
        delivered["residual"].append(residual / 2)
    out["delivered"] = {k: torch.cat(v) for k, v in delivered.items()}
    return out


def within_nodes(groups):
    model = gpt()
    return shard_model(model, MODELS["gpt"].shard_units(model), mesh=node_mesh(groups, torch.device("cpu")))


def test_hybrid_sharding_shards_within_nodes_and_sums_across_them_through_any_codec():
    ranks = run_workers(hybrid_against_ddp, 4)
    first, parameters = ranks[0], sum(p.numel() for p in gpt().parameters())
    for name, tensor in first["ddp"].items():
        assert torch.allclose(first["fp32"]["state"][name], tensor, rtol=0, atol=1e-6), name
        assert torch.allclose(first["fsdp2"][0][name], first["ddp", "lars"][name], rtol=0, atol=1e-6), name
    assert all(rank["fp32"]["local"] == rank["fsdp2"][1] == parameters // 2 for rank in ranks)  # a node's half
    # a step: the node's fp32 reduce-scatter sends half the gradient (4 bytes an element), then the cross-node sum of
    # this rank's half on the codec's wire, a ring of 2 nodes sending it once
    assert first["fp32"]["sent"] == STEPS * (2 * parameters + 2 * parameters)
    assert first["bf16"]["sent"] == STEPS * (2 * parameters + parameters)
    # fp8 across nodes, relative to each shard's weights: a quarter of fp32's bytes there (and a flag byte a tensor),
    # no farther from fp32 than our engine's fp8 over the whole gradients
    node = 2 * parameters  # a step's node reduce-scatter, fp32
    assert STEPS * (node + parameters // 2) < first["fp8"]["sent"] < STEPS * (1.05 * node + parameters // 2)
    start, ddp = (torch.cat([s[k].flatten() for k in first["ddp"]]) for s in ({**gpt().state_dict()}, first["ddp"]))
    off = {m: (torch.cat([s[k].flatten() for k in first["ddp"]]) - ddp).norm() / (ddp - start).norm()
           for m, s in (("hybrid", first["fp8"]["state"]), ("ours", first["ours", "fp8"]))}
    assert off["hybrid"] < 1.25 * off["ours"], off
    # 1-bit Adam's momentum across nodes: more than 16x fewer bytes there than fp32's
    assert (first["onebit"]["sent"] - STEPS * node) * 16 < STEPS * 2 * parameters
    # top-k with error feedback on each rank's shard: what it delivers and what it keeps sum to the mean gradient
    got = first["delivered"]
    assert torch.allclose(got["topk"] + got["residual"], got["fp32"], rtol=0, atol=1e-6)
    assert (got["topk"] != 0).float().mean() < 0.5 < (got["residual"] != 0).float().mean()
    # a checkpoint's residuals come back to the rank holding the same shards only
    assert all(rank["other shards"] == {} and rank["same shards"] for rank in ranks)


WHOLE_SUMS = ("onebit", "topk", "lowrank")  # their exchange takes each unit's whole gradients


def whole_sums_sharded_and_not(rank, world):
    """Codecs whose sum does not end in shards, on a model whose units hold one parameter each (3 ranks: 32 rows
    padded to 33): FSDP's unit is our engine's bucket of that parameter, so the exchange is the same one."""
    out = {}
    for codec in WHOLE_SUMS:
        for engine in ("scalesgd", "scalesgd-fsdp"):
            model = two_layers()
            if engine == "scalesgd-fsdp":
                shard_model(model, [model[0], model[2]])
            with warnings.catch_warnings(category=EarlyFreezeWarning, action="ignore"):
                optimizer = (OneBitAdam(model.parameters(), lr=1e-2, freeze_step=2) if codec == "onebit" else
                             torch.optim.AdamW(model.parameters(), lr=1e-2))
            exchange = build_exchange(engine, model, optimizer, ExchangeSetup(
                codec, CodecSettings(TopkOptions(density=0.1)), compress_after=2, buckets="layer"))
            g = torch.Generator().manual_seed(rank)
            for _ in range(5):  # 2 dense steps (1-bit Adam's warm-up), then 3 compressed (its variance frozen)
                x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
                exchange.backward(torch.nn.functional.cross_entropy(exchange.model(x), y))
                exchange.step()
                optimizer.zero_grad()
            held = sum(s["exp_avg_sq"].to_local().numel() if engine == "scalesgd-fsdp" else s["exp_avg_sq"].numel()
                       for s in optimizer.state.values())
            out[codec, engine] = (whole(exchange, model), exchange.stats().bytes_sent, held)
            exchange.close()
    return out


def test_one_bit_adam_top_k_and_low_rank_on_shards_step_as_unsharded_for_the_same_bytes_their_state_sharded():
    first = run_workers(whole_sums_sharded_and_not, 3)[0]
    for codec in WHOLE_SUMS:
        (unsharded, sent, held) = first[codec, "scalesgd"]
        (sharded, sharded_sent, sharded_held) = first[codec, "scalesgd-fsdp"]
        for name, tensor in unsharded.items():
            assert torch.allclose(sharded[name], tensor, rtol=0, atol=1e-5), (codec, name)
            assert not torch.allclose(tensor, two_layers().state_dict()[name], atol=1e-3), (codec, name)  # it moved
        assert sharded_sent == sent and sharded_held == 11 * 16 + 2 * 32 < held / 2.5, codec  # Adam's variance


def two_layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.Tanh(), torch.nn.Linear(32, 4, bias=False))
