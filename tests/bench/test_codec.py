"""`scalesgd bench codec` end to end (eager path only: compiling is covered in tests/comm/test_fp8.py)."""

import json
import re

import pytest

from tests.bench.cli import bench


def test_bench_codec_times_every_kernel_and_writes_its_files(tmp_path):
    out = tmp_path / "codec"
    proc = bench("codec", "--sizes", "1K,4K", "--paths", "eager", "--repeats", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "codec.json").read_text())
    kernels = {(r["kernel"], r["numel"]) for r in record["results"]}
    assert kernels == {(k, n) for k in ("encode", "decode", "encode_relative", "decode_relative", "clipped_relative", "add")
                       for n in (1024, 4096)}
    table = (out / "codec.md").read_text()
    assert table.startswith("`scalesgd bench codec")
    for r in record["results"]:
        assert r["path"] == "eager" and r["same_as_eager"] is True
        assert r["gbps"] == pytest.approx(4 * r["numel"] / r["median_s"] / 1e9)  # float32 bytes per second
        row = next(line for line in table.splitlines() if line.startswith(f"| {r['kernel']} (")
                   and f"| {r['numel']:,} |" in line)
        assert re.split(r"(?<!\\)\|", row)[3].strip() == f"{r['gbps']:.2f}"  # what the record holds, in its cell
    assert (out / "codec.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_path_is_one_line_exit_2(tmp_path):
    proc = bench("codec", "--paths", "fused", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--paths 'fused' is not known; choose from compiled, eager" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_gpu_asked_for_where_there_is_none_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, on any machine
    proc = bench("codec", "--device", "cuda", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--device cuda: needs a CUDA GPU and PyTorch sees none here; choose cpu or auto" in proc.stderr
