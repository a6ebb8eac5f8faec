"""`--exchange auto`: every rank measures, rank 0 decides, every rank uses the same choice."""

import json
from dataclasses import replace

import pytest
import torch

from scalesgd.comm.codecs import CodecSettings, TopkOptions
from scalesgd.models import build_model
from scalesgd.comm.codecs import CODECS
from scalesgd.config import TrainConfig
from scalesgd.train import auto
from scalesgd.sim.exchange import Costs, predict
from scalesgd.sim.modes import parse_mode
from scalesgd.sim import quality
from scalesgd.sim.quality import StepsToTarget
from scalesgd.train.auto import PLANS, Decision, Weighed, decide
from scalesgd.train.auto_rank import (FINALIST_MARGIN, FINALISTS, RESOLUTION, Candidate, finalists,
                                      periodic_candidate, periodic_options, periodic_settings, pick, steps_for)
from tests.sim.test_exchange import PROFILE, cluster
from tests.spawn_util import run_workers


def _decide(rank, world):
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    batch = (torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,)))
    decision = decide(model, batch, torch.nn.functional.cross_entropy,
                      Weighed(("fp32", "lowrank-acp", "ddp-fp16", "topk-global"),
                              CodecSettings(TopkOptions(density=0.01)), "ring", None, None, 1, 4))
    return decision.to_dict()


def test_every_rank_gets_rank_zeros_choice_of_the_fastest_candidate():
    first, second = run_workers(_decide, 2)
    assert first == second
    table = first["candidates"]
    # every plan for our codecs, DDP's own buckets for its fp16 hook, topk-global's own rule (one bucket)
    assert sorted((r["exchange"], r["plan"]) for r in table) == sorted(
        [(c, p) for c in ("fp32", "lowrank-acp") for p in PLANS] + [("ddp-fp16", "ddp"), ("topk-global", "single")])
    fastest = min(r["iteration_s"] for r in table)
    tied = [r for r in table if r["iteration_s"] <= fastest * (1 + RESOLUTION)]
    chosen = next(r for r in table if (r["exchange"], r["plan"]) == (first["codec"], first["buckets"]))
    assert chosen in tied and chosen["buckets_n"] == min(r["buckets_n"] for r in tied)
    assert first["predicted_s"] == chosen["iteration_s"] and len(first["groups"]) == chosen["buckets_n"]
    assert sorted(i for g in first["groups"] for i in g) == list(range(len(list(build_model("resnet8", 10, 3)
                                                                               .parameters()))))
    assert (first["finalists"][0]["exchange"], first["finalists"][0]["plan"]) == (first["codec"], first["buckets"])
    assert all(f["iteration_s"] <= first["predicted_s"] * (1 + FINALIST_MARGIN) for f in first["finalists"])
    json.dumps(first)  # what summary.json and auto.json hold


def _row(codec, seconds, buckets=1, **more):
    return Candidate(codec, seconds, 0.0, f"size:{buckets}", ((0,),) * buckets, **more)


def test_a_tie_goes_to_the_fewest_buckets():
    table = [_row("fp32", 1.00, 4), _row("fp32", 1.02, 1), _row("fp16", 1.50)]
    assert pick(table) is table[1]
    table[1] = _row("fp32", 1.2, 1)  # no longer within the model's resolution
    assert pick(table) is table[0]


def test_candidates_rank_by_time_to_the_target_and_one_that_missed_it_is_never_chosen():
    fast_but_missed = _row("lowrank", 0.5, missed=True)
    fewer_steps = _row("fp8", 0.95, steps_factor=0.8)
    more_steps = _row("fp16", 0.90, steps_factor=1.2)
    assert (fewer_steps.to_target_s, more_steps.to_target_s) == pytest.approx((0.76, 1.08))
    table = [fast_but_missed, more_steps, fewer_steps, _row("fp32", 1.0)]
    assert pick(table) is fewer_steps  # not the fastest step: the soonest to the target
    assert fast_but_missed not in finalists(table, fewer_steps)
    decision = Decision(fewer_steps, table, [more_steps, fewer_steps]).tried([0.9, 1.0])
    assert decision.chosen is fewer_steps  # measured slower a step (1.0 against 0.9), sooner to the target (0.8 × 1.0)
    assert decision.measured_s == 1.0


def test_finalists_are_the_best_plan_of_each_codec_the_model_cannot_rank_apart():
    table = [_row("fp32", 1.00, 4), _row("fp16", 0.90), _row("fp16", 0.91, 4), _row("fp8", 1.10), _row("bf16", 1.20),
             _row("topk", 2.00)]
    best = pick(table)
    assert best is table[1]
    chosen = finalists(table, best)
    assert [c.exchange for c in chosen] == ["fp16", "fp32", "fp8"][:FINALISTS]
    assert chosen[0] is best and all(c.iteration_s <= 0.90 * (1 + FINALIST_MARGIN) for c in chosen)
    assert finalists([_row("fp16", 1.0), _row("fp8", 1.0 * (1 + FINALIST_MARGIN) + 0.01)], _row("fp16", 1.0)) \
        == [_row("fp16", 1.0)]  # nothing close: the model's choice stands untried
    close = [_row(c, 0.90 + i / 100) for i, c in enumerate(("fp16", "fp8", "bf16", "lowrank", "lowrank-acp", "ddp"))]
    assert [c.exchange for c in finalists(close, close[0])] == ["fp16", "fp8", "bf16", "lowrank", "lowrank-acp",
                                                                "ddp"][:FINALISTS - 1] + ["ddp"]  # not compressing too


def test_a_trial_picks_the_finalist_measured_fastest_and_keeps_every_measurement():
    rows = [Candidate(c, p, 0.0, "size:1", ((i,),)) for i, (c, p) in enumerate([("fp16", 0.9), ("fp32", 1.0),
                                                                               ("fp8", 1.1)])]
    tried = Decision(rows[0], rows, rows).tried([1.3, 1.2, 1.25])
    record = tried.to_dict()
    assert (record["codec"], record["groups"], record["predicted_s"], record["trial_s"]) == ("fp32", [[1]], 1.0, 1.2)
    assert [f["measured_s"] for f in record["finalists"]] == [1.3, 1.2, 1.25]
    assert Decision.from_dict(json.loads(json.dumps(record))) == tried


def _trial_ddp_and_ours(rank, world):
    torch.manual_seed(0)
    model = build_model("resnet8", 10, 3)
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,)))]
    cfg = TrainConfig.from_dict({"workers": world, "model": "resnet8", "batch_size": 4 * world})
    engines = []
    step = auto._step

    def counted(exchange, *args):
        engines.append(type(exchange).__name__)
        return step(exchange, *args)

    auto._step = counted
    backward = (tuple(range(len(list(model.parameters()))))[::-1],)
    finals = [Candidate("ddp-powersgd", 1.0, 0.0, "ddp", backward), Candidate("lowrank", 1.0, 0.0, "single", backward)]
    before = [p.detach().clone() for p in model.parameters()]
    times = auto.trial(cfg, model, batches, torch.nn.functional.cross_entropy,
                       type("Env", (), {"topology_groups": None})(), finals)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return times, engines.count("DdpExchange"), engines.count("EngineExchange"), unchanged


def test_a_trial_runs_ddps_powersgd_past_its_plain_start_beside_ours_and_leaves_the_model_alone():
    for times, on_ddp, on_ours, unchanged in run_workers(_trial_ddp_and_ours, 2):
        timed = auto.TRIAL_ROUNDS * auto.TRIAL_PER_ROUND
        assert len(times) == 2 and all(t > 0 for t in times)
        assert on_ddp == auto.TRIAL_WARMUP + CODECS["powersgd"].warm_start + timed  # timed only once compressing
        assert on_ours == auto.TRIAL_WARMUP + timed and unchanged


def test_periodic_modes_that_reached_the_target_are_predicted_to_it_and_one_that_missed_is_not_shown():
    table = {"periodic@16-fp8": StepsToTarget("periodic@16-fp8", "--local-steps 16 --codec fp8", 1.1, 2.0, 3, "x"),
             "periodic@16-fp32": StepsToTarget("periodic@16-fp32", "--local-steps 16", None, 2.7, 1, "x"),
             "scalesgd-fp8": StepsToTarget("scalesgd-fp8", "--codec fp8", 1.0, 2.2, 1, "x")}
    slow = cluster(rate=1e6)
    rows = periodic_options(table, PROFILE, slow, {})
    assert [r["mode"] for r in rows] == ["periodic@16-fp8"] and rows[0]["options"] == "--local-steps 16 --codec fp8"
    round_step = predict(parse_mode("periodic@16-fp8"), PROFILE, slow).iteration_s
    assert rows[0]["to_target_s"] == pytest.approx(1.1 * round_step)


def test_periodic_modes_are_predicted_with_their_steps_at_the_clusters_worker_count():
    fp8 = StepsToTarget("periodic@16-fp8", "--local-steps 16 --codec fp8", 1.1, 2.0, 3, "x", by_workers={8: 1.6})
    ft = StepsToTarget("periodic@32-fp8", "--local-steps 32 --codec fp8", 1.2, 2.0, 3, "x", by_workers={8: None})
    eight = cluster(rate=1e6, nodes=8)
    rows = periodic_options({fp8.key: fp8, ft.key: ft}, PROFILE, eight, {})
    assert [r["mode"] for r in rows] == [fp8.key]  # missed with 8 workers: not shown there
    assert rows[0]["to_target_s"] == pytest.approx(1.6 * predict(parse_mode(fp8.key), PROFILE, eight).iteration_s)
    settings = {"local_steps": 32, "codec": "fp8"}
    assert periodic_candidate(ft, settings, PROFILE, eight, Costs()).missed  # never chosen there
    assert not periodic_candidate(ft, settings, PROFILE, cluster(rate=1e6, nodes=2), Costs()).missed


GPT = TrainConfig.from_argv(["--model", "gpt", "--dataset", "text", "--exchange", "auto", "--epochs", "1"])


def _steps(options, factor=1.1, key="periodic@16-fp8"):
    return StepsToTarget(key, options, factor, 2.0, 3, "x")


def test_auto_may_choose_a_periodic_mode_only_as_measured_and_only_where_it_changes_no_more_than_the_exchange():
    assert periodic_settings(_steps("--local-steps 16 --codec fp8 --outer-momentum 0.5"), GPT) == {
        "local_steps": 16, "codec": "fp8", "outer_momentum": 0.5}
    assert periodic_settings(_steps("--local-steps 16 --codec fp8 --epochs 2"), GPT) is None  # another schedule
    assert periodic_settings(_steps("--local-steps 16 --codec fp8 --epochs 2"), GPT.replaced(epochs=2)) == {
        "local_steps": 16, "codec": "fp8"}  # the run's own: auto changes only how it exchanges
    assert periodic_settings(_steps("--local-steps 16 --codec fp8", factor=None), GPT) is None  # missed the target
    assert periodic_settings(_steps("--peer torchft --local-steps 16", key="torchft:periodic@16-fp32"), GPT) is None
    assert periodic_settings(_steps("--local-steps 16 --codec fp8"), GPT.replaced(auto_codecs=("fp16",))) is None
    assert periodic_settings(_steps("--local-steps 16 --codec fp8"), GPT.replaced(auto_periodic=False)) is None
    assert periodic_settings(_steps("--local-steps 16 --fragments 3 --codec fp8"), GPT) is None  # invalid: 3 ∤ 16


def test_a_run_under_another_optimizer_is_ranked_by_its_measured_steps_and_else_by_the_recipes():
    muon = GPT.replaced(optimizer="muon", epochs=2)
    optimizer, rows = steps_for(muon)
    assert optimizer == "muon" and rows == quality.table("text", optimizer="muon")
    assert rows["ddp-fp16"].factor == rows["ddp"].factor != 1.0  # per step: as DDP under Muon, not under AdamW
    assert periodic_settings(rows["periodic@16-fp8"], muon) == {"local_steps": 16, "codec": "fp8",
                                                                "outer_momentum": 0.5}  # measured under Muon: its own
    assert steps_for(GPT) == ("", quality.table("text"))
    assert steps_for(GPT.replaced(optimizer="lamb")) == ("", quality.table("text"))  # none measured: the recipe's
    record = Decision(_row("fp8", 1.0), [_row("fp8", 1.0)], steps_under="muon").to_dict()
    assert Decision.from_dict(json.loads(json.dumps(record))).steps_under == "muon"


def test_a_periodic_mode_is_chosen_where_sooner_to_the_target_and_a_tie_keeps_exchanging_every_step():
    per_step = _row("fp8", 1.0, steps_factor=1.0)
    settings = {"local_steps": 16, "codec": "fp8"}
    periodic = Candidate("fp8", 0.8166, 0.0, steps_factor=1.2, mode="periodic@16-fp8", settings=settings)
    assert pick([per_step, periodic]) is per_step  # 0.98 against 1.0: within the model's resolution
    periodic = replace(periodic, iteration_s=0.5)
    assert pick([per_step, periodic]) is periodic and finalists([per_step, periodic], per_step) == [per_step]
    chosen = Decision(periodic, [periodic])
    record = chosen.to_dict()
    assert (record["mode"], record["buckets"], record["settings"]) == ("periodic@16-fp8", "", settings)
    assert chosen.compresses and Decision.from_dict(json.loads(json.dumps(record))) == chosen
    earlier = {**record, "buckets": "periodic@16-fp8"}  # an earlier version's auto.json: the mode as its buckets
    del earlier["chosen"], earlier["mode"]
    assert Decision.from_dict(earlier).chosen.mode == "periodic@16-fp8"


def test_a_periodic_choice_switches_the_run_to_periodic_synchronisation_without_a_bucket_plan(tmp_path):
    settings = {"local_steps": 16, "codec": "fp8", "outer_momentum": 0.5}
    periodic = Candidate("fp8", 0.5, 0.0, mode="periodic@16-fp8", settings=settings)
    saved = Decision(periodic, [periodic])
    (tmp_path / auto.AUTO_NAME).write_text(json.dumps(saved.to_dict()))
    cfg, plan, record = auto.choose(GPT, None, [], None, type("Env", (), {"is_main": False})(), tmp_path, True)
    assert (cfg.periodic.local_steps, cfg.periodic.outer_momentum, cfg.exchange.codec, plan) == (16, 0.5, "fp8", None)
    assert record["settings"] == settings


def _decide_on_shards(rank, world, bytes_per_s):
    from scalesgd.comm.cost.link import LinkCost
    from scalesgd.comm.wire.topology import Topology, build_groups
    from scalesgd.sim.compute import unit_names

    slow = LinkCost(1e-4, bytes_per_s)
    auto.link.measure_topology = lambda *args, **kwargs: {"inter": slow, "intra": slow}  # this rank's link, as given
    torch.manual_seed(0)
    model = build_model("gpt", 256, 1)
    batch = (torch.randint(0, 256, (4, 64)), torch.randint(0, 256, (4, 64)))
    loss = lambda out, y: torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())  # noqa: E731
    groups = build_groups(Topology(world, rank, 1))  # fp8 sums in two stages: its probe needs the nodes (of 1)
    return decide(model, batch, loss, Weighed(("fp32", "bf16", "fp8"), CodecSettings(), "ring", None, groups, 1, 4,
                                              shard="", units=unit_names(model, "gpt"))).to_dict()


@pytest.mark.parametrize("bytes_per_s", [1.25e5, 1.25e11])
def test_on_shards_auto_costs_each_codec_on_the_units_sums_and_chooses_by_the_link(bytes_per_s):
    first, second = run_workers(_decide_on_shards, 2, bytes_per_s)
    assert first == second and first["buckets"] == "units"
    assert sorted((r["exchange"], r["plan"]) for r in first["candidates"]) == [("bf16", "units"), ("fp32", "units"),
                                                                                ("fp8", "units")]
    times = {r["exchange"]: r["iteration_s"] for r in first["candidates"]}
    if bytes_per_s < 1e6:  # at 1 Mbit/s a step is mostly the all-gathers and sums: fewer bytes, sooner
        assert first["codec"] == "fp8" and times["fp8"] < times["bf16"] < times["fp32"]
    else:  # on a free link only the codecs' own work differs: fp8's encoding costs more than its bytes save
        assert first["codec"] != "fp8" and times["fp8"] == max(times.values())
    assert first["finalists"] == [] and first["trial_s"] is None  # chosen by the model alone


def test_a_choice_on_shards_keeps_the_sharded_engine_and_its_units_as_buckets(tmp_path):
    chosen = Candidate("fp8", 0.5, 0.0, "units")
    saved = Decision(chosen, [chosen])
    (tmp_path / auto.AUTO_NAME).write_text(json.dumps(saved.to_dict()))
    sharded = TrainConfig.from_argv(["--model", "gpt", "--dataset", "text", "--exchange", "auto", "--engine",
                                     "scalesgd-fsdp", "--shard", "node", "--workers", "4", "--procs-per-node",
                                     "2"]).validate()
    cfg, plan, record = auto.choose(sharded, None, [], None, type("Env", (), {"is_main": False})(), tmp_path, True)
    assert (cfg.exchange.engine, cfg.exchange.shard, cfg.exchange.codec, plan) == ("scalesgd-fsdp", "node", "fp8", None)
    assert record["codec"] == "fp8"
