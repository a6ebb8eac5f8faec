"""`scalesgd bench train`: every mode, side by side, on two local workers."""

import functools
import json

import pytest
import torch

from scalesgd.bench import train as train_bench
from scalesgd.bench.train import TrainBenchConfig, criterion, describe, synthetic_batches
from scalesgd.bench.train_report import add_ratios, spread
from scalesgd.cli import main
from scalesgd.comm.wire.compact import compact_size
from scalesgd.config import AUTO_CODECS
from scalesgd.models import ModelOptions
from scalesgd.models.gpt import GptOptions, gpt
from scalesgd.sim.modes import Mode, parse_mode
from scalesgd.runtime import process_group
from tests.bench.cli import bench
from tests.spawn_util import ddp_wrappers_at_destroy, run_workers


def test_modes_parse_with_defaults():
    assert parse_mode("none") == Mode("none", "none")
    assert parse_mode("ddp") == Mode("ddp", "ddp", "fp32")
    assert parse_mode("ddp-powersgd") == Mode("ddp-powersgd", "ddp", "powersgd")
    assert parse_mode("scalesgd") == Mode("scalesgd", "scalesgd", "fp32", "ring", "size:1")
    assert parse_mode("scalesgd-fp16-halving_doubling-growing:0.5:2") == Mode(
        "scalesgd-fp16-halving_doubling-growing:0.5:2", "scalesgd", "fp16", "halving_doubling", "growing:0.5:2")
    with pytest.raises(ValueError, match="use none, ddp"):
        parse_mode("horovod")


def test_codec_names_with_dashes_densities_and_planners_parse():
    assert parse_mode("scalesgd-fp8-direct-hierarchical") == Mode(
        "scalesgd-fp8-direct-hierarchical", "scalesgd", "fp8-direct", "hierarchical", "size:1")
    mode = parse_mode("scalesgd-topk-global@0.01")
    assert (mode.codec, mode.codec_options(), mode.planner) == ("topk-global", {"density": 0.01}, "none")
    mode = parse_mode("scalesgd-topk@0.1-ring-planner:optimal")
    assert (mode.codec, mode.options["topk"].density, mode.buckets, mode.planner) == (
        "topk", 0.1, "planner:optimal", "optimal")
    with pytest.raises(ValueError, match="density 'x' is not a number"):
        parse_mode("scalesgd-topk@x")


def test_sparse_modes_report_their_plan_and_prediction(tmp_path):
    out = tmp_path / "bench"
    modes = "ddp,scalesgd-topk@0.1-ring-planner:optimal,scalesgd-topk-global@0.01,scalesgd-lags@0.1,auto-fp32+fp16"
    proc = bench("train", "--workers", "2", "--model", "resnet8", "--image-size", "8", "--batch-size", "16",
                 "--modes", modes, "--warmup", "2", "--iterations", "2", "--rounds", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["mode"]: r for r in json.loads((out / "train.json").read_text())["results"]}
    planned = results["scalesgd-topk@0.1-ring-planner:optimal"]
    assert planned["planned_groups"] >= 1 and planned["predicted_s"] > 0 and planned["measured_exchange_end_s"] > 0
    # at 1 % of 78,042 entries (781 per rank), a rank sends its own entries in one compact message (fp16 values,
    # 16-bit offsets in 2 blocks of 65,536) and its (length, non-finite flag) pair, 16 bytes
    assert results["scalesgd-topk-global@0.01"]["mean_bytes_sent"] == compact_size(781, 78_042) + 16
    assert "predicted_s" not in results["scalesgd-lags@0.1"]
    auto = results["auto-fp32+fp16"]
    assert auto["auto_choice"].split()[0] in ("fp32", "fp16") and auto["predicted_s"] > 0
    record = json.loads((out / "train.json").read_text())  # what `scalesgd simulate --validate` reads
    assert record["topology"] == {"nodes": 1, "procs_per_node": 2}
    assert record["links"][0]["intra"]["bytes_per_s"] > 0 and record["links"][0]["inter"] is None
    assert len(record["layers"]["t_b"]) == len(record["layers"]["sizes"]) and record["layers"]["t_f"] > 0


def test_bench_train_measures_every_mode_against_ddp(tmp_path):
    out = tmp_path / "bench"
    modes = "none,ddp,ddp-fp16,ddp-powersgd,scalesgd-fp32-ring-layer,scalesgd-fp16-hierarchical-size:0.01"
    proc = bench("train", "--workers", "2", "--model", "resnet8", "--image-size", "8", "--batch-size", "16",
                 "--modes", modes, "--procs-per-node", "1", "--warmup", "1", "--iterations", "4", "--rounds", "2",
                 "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "train.json").read_text())
    results = {r["mode"]: r for r in record["results"]}
    assert list(results) == modes.split(",")
    assert all(r["iterations"] == 4 and r["median_iteration_s"] > 0 for r in results.values())
    # PowerSGD's 10 plain-allreduce iterations are never timed, whatever --warmup says
    assert {m: r["untimed_iterations"] for m, r in results.items() if r["untimed_iterations"] != 1} == \
        {"ddp-powersgd": 11}
    ours = results["scalesgd-fp32-ring-layer"]
    assert ours["mean_bytes_sent"] == 78_042 * 4  # ring on 2 ranks sends 2(p−1)/p of the gradient
    assert results["scalesgd-fp16-hierarchical-size:0.01"]["mean_bytes_sent"] == 78_042 * 2
    assert "mean_exposed_s" in ours and "mean_exposed_s" not in results["ddp"]
    assert all(r["mean_cpu_s"] > 0 for r in results.values())  # CPU of all the process's threads
    assert 0 < ours["mean_thread_cpu_s"] < ours["mean_cpu_s"]  # the communication thread's share
    assert "| ddp-powersgd |" in (out / "train.md").read_text()
    assert (out / "train.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_mode_is_one_line_exit_2(tmp_path):
    proc = bench("train", "--modes", "ddp,scalesgd-fp7", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--modes scalesgd-fp7: mode 'scalesgd-fp7': codec 'fp7' is not known; choose from fp32, fp16, bf16" \
        in proc.stderr


def test_the_shared_run_is_checked_as_the_train_config_it_describes(tmp_path, capsys):
    code = main(["bench", "train", "--modes", "none", "--batch-size", "9", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err == "scalesgd: error: --batch-size 9 does not divide evenly by --workers 2; use a " \
                                "multiple of 2\n"
    assert not (tmp_path / "x").exists()


def test_a_sweep_needs_the_testbed_and_tc_rates(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SCALESGD_TESTBED", raising=False)
    code = main(["bench", "train", "--bandwidths", "1gbit", "--out", str(tmp_path / "x")])
    assert code == 2 and "--bandwidths reshape the testbed: run under `scalesgd testbed run" in capsys.readouterr().err
    code = main(["bench", "train", "--bandwidths", "fast", "--out", str(tmp_path / "x")])
    assert code == 2 and "--bandwidths 'fast': use tc rates such as" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_ratios_carry_their_spread_over_rounds():
    ddp = {"mode": "ddp", "bandwidth": None, "median_iteration_s": 2.0, "round_medians_s": [2.0, 1.8, 2.2]}
    fast = {"mode": "scalesgd-fp8", "bandwidth": None, "median_iteration_s": 1.0, "round_medians_s": [1.0, 1.2, 0.9]}
    none = {"mode": "none", "bandwidth": None, "median_iteration_s": 0.8, "round_medians_s": [0.8, 0.8, 0.8]}
    rows = [none, ddp, fast]
    add_ratios(rows)
    assert fast["ddp_ratio"] == (2.0, 1.5, 2.2 / 0.9)
    assert fast["bound_ratio"] == (0.8, 0.8 / 1.2, 0.8 / 0.9)
    assert spread(fast["ddp_ratio"]) == "2.00 (1.50–2.44)"


def test_auto_modes_parse_with_their_candidates():
    assert parse_mode("auto").auto_codecs == AUTO_CODECS
    mode = parse_mode("auto-fp16+topk+ddp-powersgd@0.01")
    assert (mode.engine, mode.auto_codecs, mode.codec_options()) == ("auto", ("fp16", "topk", "ddp-powersgd"),
                                                                     {"density": 0.01})
    with pytest.raises(ValueError, match="exchange 'fp7' is not known"):
        parse_mode("auto-fp16+fp7")


TINY_GPT = ("--model", "gpt", "--gpt-layers", "1", "--gpt-heads", "2", "--gpt-width", "16", "--gpt-block", "8")


def test_a_gpt_bench_times_next_token_batches_as_the_text_run_it_describes():
    bench = TrainBenchConfig(model="gpt", batch_size=4,
                             model_options=ModelOptions.of(GptOptions(layers=1, heads=2, width=16, block=8)))
    run = describe(parse_mode("scalesgd-fp16"), bench, 2).validate()
    assert (run.data.dataset, run.data.text, run.model.options["gpt"]) == ("text", True, GptOptions(1, 2, 16, 8))
    assert run.to_dict()["gpt_width"] == 16
    x, y = synthetic_batches(bench, 2, 0)[0]
    assert x.shape == y.shape == (2, 8) and x.dtype == torch.long and torch.equal(x[:, 1:], y[:, :-1])
    logits = torch.randn(2, 8, 256)  # each rank's mean over its tokens: the global batch's mean, averaged
    assert criterion(bench, 2)(logits, y) == pytest.approx(
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item())


def test_bench_train_times_a_gpt(tmp_path):
    out = tmp_path / "bench"
    proc = bench("train", "--workers", "2", *TINY_GPT, "--batch-size", "4", "--modes",
                 "none,ddp,scalesgd-topk@0.1-ring-planner:optimal", "--warmup", "0", "--iterations", "2",
                 "--rounds", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "train.json").read_text())
    results = {r["mode"]: r for r in record["results"]}
    assert all(r["iterations"] == 2 and r["tokens_per_s"] == pytest.approx(8 * r["images_per_s"])
               for r in results.values())
    assert results["scalesgd-topk@0.1-ring-planner:optimal"]["planned_groups"] >= 1
    net = gpt(256, GptOptions(layers=1, heads=2, width=16, block=8))
    assert sum(record["layers"]["sizes"]) == sum(p.numel() for p in net.parameters())  # the tied head once
    assert record["config"]["gpt_block"] == 8


def test_a_gpt_whose_width_does_not_split_into_its_heads_is_refused(tmp_path, capsys):
    code = main(["bench", "train", "--model", "gpt", "--gpt-heads", "3", "--out", str(tmp_path / "x")])
    assert code == 2 and capsys.readouterr().err == \
        "scalesgd: error: --gpt-width 128: GPT width 128 is not divisible by its 3 heads\n"


def test_a_periodic_mode_is_timed_over_whole_rounds_and_sends_a_pseudo_gradient_a_round(tmp_path):
    out = tmp_path / "bench"
    proc = bench("train", "--workers", "2", "--model", "resnet8", "--image-size", "8", "--batch-size", "16",
                 "--modes", "none,scalesgd-fp32,periodic@4", "--procs-per-node", "1", "--warmup", "1",
                 "--iterations", "8", "--rounds", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["mode"]: r for r in json.loads((out / "train.json").read_text())["results"]}
    assert results["periodic@4"]["mean_bytes_sent"] == results["scalesgd-fp32"]["mean_bytes_sent"] / 4
    refused = bench("train", "--modes", "periodic@4", "--iterations", "6", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "--iterations 6 must be a multiple of its H, 4" in refused.stderr


def _bench_on_the_group(out, rank, world):
    env = process_group.DistEnv(rank, world, rank, world, torch.device("cpu"))
    process_group.init = lambda *args, **kwargs: env  # the workers' group is up already
    cfg = TrainBenchConfig(model="resnet8", image_size=8, batch_size=8, modes=("ddp", "ddp-fp16"), warmup=0,
                           iterations=1, rounds=1, out=out)
    assert train_bench.run(cfg, "scalesgd bench train") == 0


def test_bench_train_lets_its_ddp_wrappers_go_before_it_destroys_the_group(tmp_path):
    # a wrapper freed after joins gloo's threads holding the GIL one may wait for: 1 exit in ~30 hung
    run = functools.partial(_bench_on_the_group, str(tmp_path))
    assert run_workers(ddp_wrappers_at_destroy, 2, run) == [[0], [0]]
    assert (tmp_path / "train.json").exists()
