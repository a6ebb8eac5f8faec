"""`scalesgd bench optimizer` end to end, on a small model so the test stays quick."""

import json

import pytest
import torch

from scalesgd.cli import main
from tests.bench.cli import bench


def test_bench_optimizer_times_each_optimizer_against_sgd_and_writes_its_files(tmp_path):
    out = tmp_path / "optimizer"
    proc = bench("optimizer", "--model", "resnet8", "--optimizers", "sgd,lars,naive-lars,sgd-foreach",
                 "--repeats", "3", "--warmup", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "optimizer.json").read_text())
    results = {r["optimizer"]: r for r in record["results"]}
    assert list(results) == ["sgd", "lars", "naive-lars", "sgd-foreach"]
    for r in results.values():
        assert len(r["times_ms"]) == 3 and 0 < r["min_ms"] <= r["median_ms"]
        assert r["ratio_median"] == pytest.approx(r["median_ms"] / results["sgd"]["median_ms"])
        assert r["ratio_min"] == pytest.approx(r["min_ms"] / results["sgd"]["min_ms"])
    assert results["sgd"]["ratio_median"] == 1.0 and len(record["load_average_1_5_15"]) == 3
    groups = record["parameters"]["groups"]
    assert [g["weight_decay"] for g in groups] == [5e-5, 0.0] and all(g["tensors"] > 0 for g in groups)
    assert record["parameters"]["tensors"] == sum(g["tensors"] for g in groups)
    md = (out / "optimizer.md").read_text()
    assert md.startswith("`scalesgd bench optimizer --model resnet8") and "naive-lars" in md
    assert (out / "optimizer.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_optimizer_times_muon_on_the_gpt_and_records_whether_onednn_computes_its_bf16(tmp_path):
    out = tmp_path / "muon"
    proc = bench("optimizer", "--model", "gpt", "--optimizers", "sgd,adamw,muon", "--repeats", "1", "--warmup", "0",
                 "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "optimizer.json").read_text())
    assert [r["optimizer"] for r in record["results"]] == ["sgd", "adamw", "muon"]
    assert record["cpu"] == {"capability": torch.backends.cpu.get_cpu_capability(),
                             "onednn_bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported()}
    assert f"bf16 in oneDNN: {'yes' if record['cpu']['onednn_bf16'] else 'no'}" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (("--optimizers", "sgd,adam"), "--optimizers 'adam' is not known; choose from sgd, sgd-foreach, lars, naive-lars, "
                                   "lamb, adamw, muon"),
    (("--optimizers", "lars"), "--optimizers lars: include sgd, the reference of the ratios"),
    (("--repeats", "0"), "--repeats 0: must be a positive number"),
    (("--weight-decay", "-1"), "--weight-decay -1.0: must be a finite number >= 0"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, message):
    code = main(["bench", "optimizer", *argv, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "x").exists()
