"""`scalesgd simulate` as a user runs it: JSON rows, files, validation, presets, and bad input in one line."""

import json

import pytest

from scalesgd.cli import main
from scalesgd.models.gpt import GptOptions, gpt
from scalesgd.sim import quality
from tests.sim.test_calibrate import write_record


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Runs without --out write under runs/ in the working directory: keep that in the test's own."""
    monkeypatch.chdir(tmp_path)


def simulate(capsys, *argv):
    code = main(["simulate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_named_model_on_a_described_cluster_prints_rows(capsys, tmp_path):
    code, out, _ = simulate(capsys, "--model", "resnet20", "--image-size", "32", "--classes", "10",
                            "--iteration-time", "0.05", "--workers", "2,8", "--procs-per-node", "2",
                            "--inter-bandwidth", "1gbit", "--modes", "ddp,scalesgd-fp8", "--json",
                            "--out", str(tmp_path / "sim"))
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [(r["workers"], r["mode"]) for r in rows] == [(2, "ddp"), (2, "scalesgd-fp8"), (8, "ddp"),
                                                         (8, "scalesgd-fp8")]
    for r in rows:
        assert set(r) == {"workers", "mode", "iteration_s", "exposed_comm_s", "images_per_s", "scaling_efficiency",
                          "steps_factor", "steps_basis", "missed", "to_target_s"}
        assert r["images_per_s"] == pytest.approx(r["workers"] * 32 / r["iteration_s"])
        assert 0 < r["scaling_efficiency"] <= 1
    saved = json.loads((tmp_path / "sim" / "simulate.json").read_text())
    assert saved["rows"] == rows and saved["command"].startswith("scalesgd simulate --model resnet20")
    table = (tmp_path / "sim" / "simulate.md").read_text().splitlines()
    for r in rows:  # one line per row, its iteration in ms and its efficiency in %, as the record has them
        assert f"| {r['workers']} | {r['mode']} | {1e3 * r['iteration_s']:.1f} |" in "\n".join(table)
        assert any(line.startswith(f"| {r['workers']} | {r['mode']} |") and
                   f"| {100 * r['scaling_efficiency']:.1f} % |" in line for line in table)
    assert (tmp_path / "sim" / "simulate.png").read_bytes()[:4] == b"\x89PNG"


def test_a_gpt_is_simulated_at_the_size_its_options_give(capsys, tmp_path):
    code, out, _ = simulate(capsys, "--model", "gpt", "--gpt-layers", "2", "--gpt-width", "64", "--gpt-block", "32",
                            "--iteration-time", "0.1", "--batch-per-worker", "8", "--workers", "2",
                            "--procs-per-node", "2", "--modes", "ddp", "--json", "--out", str(tmp_path / "sim"))
    assert code == 0
    result = json.loads(out)
    net = gpt(256, GptOptions(layers=2, width=64, block=32))
    assert result["compute"] == {"iteration_s": pytest.approx(0.1), "batch_per_worker": 8, "accumulate": 1,
                                 "parameters": sum(p.numel() for p in net.parameters())}  # the tied head once
    saved = json.loads((tmp_path / "sim" / "simulate.json").read_text())["config"]
    assert (saved["gpt_layers"], saved["gpt_width"], saved["gpt_block"]) == (2, 64, 32)


def test_a_sharded_gpt_is_costed_by_its_blocks_on_the_backend_named(capsys, tmp_path):
    rows = {}
    for backend in ("nccl", "gloo"):
        code, out, _ = simulate(capsys, "--model", "gpt", "--iteration-time", "0.1", "--batch-per-worker", "8",
                                "--workers", "4", "--procs-per-node", "2", "--inter-bandwidth", "100mbit",
                                "--modes", "scalesgd-fsdp,scalesgd-fsdp-fp8,scalesgd-fsdp:node-fp8", "--fsdp-backend",
                                backend, "--json",
                                "--out", str(tmp_path / backend))
        assert code == 0
        rows[backend] = {r["mode"]: r["iteration_s"] for r in json.loads(out)["rows"]}
    gloo, nccl = rows["gloo"], rows["nccl"]
    # fewer bytes across nodes, then a quarter's
    assert gloo["scalesgd-fsdp:node-fp8"] < gloo["scalesgd-fsdp-fp8"] < gloo["scalesgd-fsdp"]
    assert all(nccl[m] < gloo[m] for m in gloo)  # gathers ahead and sums behind compute


def test_a_language_model_gets_each_modes_measured_steps_to_the_target(capsys, tmp_path):
    shipped = quality.table("text")
    modes = [key for key in shipped if ":" not in key and not key.startswith("ddp-")][:3]
    code, out, _ = simulate(capsys, "--model", "gpt", "--iteration-time", "0.2", "--workers", "2",
                            "--procs-per-node", "1", "--inter-bandwidth", "10mbit", "--modes", ",".join(modes),
                            "--json", "--out", str(tmp_path / "sim"))
    assert code == 0
    for row in json.loads(out)["rows"]:
        steps = shipped[row["mode"]]
        assert row["missed"] == steps.missed and row["steps_factor"] == steps.factor
        assert row["to_target_s"] == (None if steps.missed else pytest.approx(row["iteration_s"] * steps.factor))


def test_failures_cost_a_periodic_mode_elastic_rounds_and_every_other_a_restart_from_the_checkpoint(capsys, tmp_path):
    code, out, _ = simulate(capsys, "--model", "gpt", "--iteration-time", "0.2", "--workers", "8",
                            "--procs-per-node", "1", "--inter-bandwidth", "10mbit", "--modes", "ddp,periodic@16-fp8",
                            "--mtbf-hours", "2", "--restart-seconds", "20", "--checkpoint-seconds", "300", "--json",
                            "--out", str(tmp_path / "sim"))
    assert code == 0
    ddp, periodic = json.loads(out)["rows"]
    assert ddp["failure_cost_s"] == pytest.approx(20 + 150)
    assert periodic["failure_cost_s"] == pytest.approx(1.1 + (16 * periodic["iteration_s"] / 2 + 20) / 8)
    for row in (ddp, periodic):
        lost = 8 * row["failure_cost_s"] / 7200
        assert row["to_target_with_failures_s"] == pytest.approx(row["to_target_s"] / (1 - lost))


def test_bandwidth_sweep_names_where_fp8_stops_paying(capsys):
    code, out, _ = simulate(capsys, "--model", "vgg16", "--image-size", "32", "--classes", "10",
                            "--iteration-time", "0.7", "--workers", "2", "--procs-per-node", "1",
                            "--inter-bandwidth", "1gbit", "--modes", "scalesgd-fp32,scalesgd-fp8", "--json")
    assert code == 0
    sweep = json.loads(out)["bandwidth"]
    fp32, fp8 = sweep["iteration_s"]["scalesgd-fp32"], sweep["iteration_s"]["scalesgd-fp8"]
    assert fp8[0] < fp32[0]  # at 10 Mbit/s fewer bytes win
    assert sweep["crossover_bytes_s"]["scalesgd-fp8"] == "beyond"  # and with free codecs never lose


def test_validate_prints_points_from_a_bench_record(capsys, tmp_path):
    bench = write_record(tmp_path / "bench")
    code, out, _ = simulate(capsys, "--validate", str(bench), "--calibration", str(bench), "--json")
    assert code == 0
    points = json.loads(out)["points"]
    assert {p["mode"] for p in points} == {"ddp", "scalesgd-fp16"} and len(points) == 6
    assert all(set(p) >= {"mode", "measured_s", "predicted_s", "error"} for p in points)


def test_a_preset_prints_its_headline(capsys, tmp_path):
    code, out, _ = simulate(capsys, "--preset", "oyama", "--json")
    assert code == 0
    assert json.loads(out)["headline"]["published"] == 3.21
    assert len(list((tmp_path / "runs").glob("simulate-*/simulate.png"))) == 1  # the default --out


@pytest.mark.parametrize("argv, message", [
    (("--model", "alexnet", "--iteration-time", "1"), "--model 'alexnet' is not known"),
    (("--model", "resnet20"), "--iteration-time 0.0: with --model give the seconds"),
    (("--model", "gpt", "--iteration-time", "1", "--gpt-heads", "3"),
     "--gpt-width 128: GPT width 128 is not divisible by its 3 heads"),
    (("--model", "resnet20", "--iteration-time", "1", "--inter-bandwidth=-5gbit"),
     "--inter-bandwidth -5gbit: use a rate such as 100mbit"),
    (("--model", "resnet20", "--iteration-time", "1", "--inter-latency", "soon"), "--inter-latency soon: use a time"),
    (("--model", "resnet20", "--iteration-time", "1", "--workers", "12", "--procs-per-node", "8"),
     "--workers 12: every count must be a positive multiple of --procs-per-node 8"),
    (("--model", "resnet20", "--iteration-time", "1", "--modes", "ddp-onebit"), "--modes ddp-onebit: mode"),
    (("--model", "resnet8", "--iteration-time", "1", "--modes", "periodic@64/64"),  # what train would refuse
     "--modes periodic@64/64: fragments 64: the model has 19 layers with parameters; give 1 to 19"),
    (("--profile", "/nonexistent"), "--profile /nonexistent: not a directory"),
    (("--profile", "/tmp", "--modes", "ddp,scalesgd-fsdp-fp8"),
     "--modes scalesgd-fsdp-fp8: a sharded mode is costed unit by unit"),
    (("--validate", "/tmp"), "/tmp is not a `scalesgd bench train` output directory"),
    ((), "give exactly one of --profile, --model"),
    (("--preset", "google"), "--preset 'google' is not known"),
    (("--model", "gpt", "--iteration-time", "1", "--cluster", "goyal", "--inter-bandwidth", "1gbit"),
     "--inter-bandwidth 1gbit: --cluster goyal brings its own"),
    (("--preset", "goyal", "--cluster", "fujitsu"), "--cluster fujitsu: give it with --model or --profile"),
    (("--model", "gpt", "--iteration-time", "1", "--cluster", "goyal", "--workers", "12"),
     "--workers 12: every count must be a positive multiple of --procs-per-node 8"),
    (("--model", "resnet20", "--iteration-time", "1", "--mtbf-hours", "-1"), "--mtbf-hours -1.0: must be"),
    (("--model", "gpt", "--iteration-time", "1", "--optimizer", "lamb"), "--optimizer lamb: with --model, one whose"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, _, err = simulate(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_paper_s_cluster_carries_a_model_to_a_thousand_workers_with_its_steps_to_the_target(capsys):
    """--cluster takes the preset's links and workers per node; a periodic mode's steps to the target at 1,024
    workers come from the shipped table's law in M, and its time to the target is its round's share × that."""
    code, out, _ = simulate(capsys, "--model", "gpt", "--iteration-time", "0.02", "--cluster", "fujitsu",
                            "--workers", "4,1024", "--modes", "ddp,periodic@16-fp8", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["cluster"]["procs_per_node"] == 4 and result["cluster"]["inter"]["bytes_per_s"] == 25e9
    rows = {(r["workers"], r["mode"]): r for r in result["rows"]}
    diloco = quality.table("text")["periodic@16-fp8"].at(1024)
    far = rows[(1024, "periodic@16-fp8")]
    assert far["steps_basis"] == "fitted" and far["steps_factor"] == pytest.approx(diloco.factor)
    assert far["to_target_s"] == pytest.approx(far["iteration_s"] * diloco.factor)
    assert rows[(1024, "ddp")]["steps_factor"] == 1.0


def test_a_profile_directory_without_a_profile_is_refused(capsys, tmp_path):
    code, _, err = simulate(capsys, "--profile", str(tmp_path))
    assert code == 2 and "holds neither a `bench train` train.json nor" in err


def test_links_fitted_from_a_bench_allreduce_record(capsys, tmp_path):
    """Ring times made from α = 1 ms and 100 MB/s on 4 ranks give those back."""
    rows = [{"algorithm": "ring", "bytes": b, "median_s": 6 * 1e-3 + 1.5 * b / 1e8} for b in (1 << 20, 1 << 24)]
    (tmp_path / "allreduce.json").write_text(json.dumps({"world_size": 4, "results": rows}))
    code, out, _ = simulate(capsys, "--model", "resnet20", "--iteration-time", "0.1", "--workers", "4",
                            "--procs-per-node", "1", "--link", str(tmp_path), "--json")
    assert code == 0
    inter = json.loads(out)["cluster"]["inter"]
    assert inter["alpha_s"] == pytest.approx(1e-3) and inter["bytes_per_s"] == pytest.approx(1e8)


def test_another_optimizer_is_predicted_from_the_steps_measured_under_it(capsys):
    """`--optimizer muon` reads Muon's rows (`periodic@16-fp8+muon`), not AdamW's: its own law in M at 1,024."""
    argv = ("--model", "gpt", "--iteration-time", "0.02", "--cluster", "fujitsu", "--workers", "8,1024", "--modes",
            "periodic@16-fp8", "--json")
    rows = {}
    for optimizer in ("", "muon"):
        code, out, _ = simulate(capsys, *argv, *(("--optimizer", optimizer) if optimizer else ()))
        assert code == 0
        rows[optimizer] = {r["workers"]: r for r in json.loads(out)["rows"]}
    muon = quality.table("text", optimizer="muon")["periodic@16-fp8"]
    assert rows["muon"][8]["steps_factor"] == muon.at(8).factor and muon.at(8).basis == "measured"
    assert rows["muon"][1024]["steps_factor"] == pytest.approx(muon.at(1024).factor)
    assert rows["muon"][8]["steps_factor"] != rows[""][8]["steps_factor"]
