"""`scalesgd bench codec` end to end (eager path only: compiling is covered in tests/comm/test_fp8.py)."""

import json

from tests.bench.cli import bench


def test_bench_codec_times_every_kernel_and_writes_its_files(tmp_path):
    out = tmp_path / "codec"
    proc = bench("codec", "--sizes", "1K,4K", "--paths", "eager", "--repeats", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "codec.json").read_text())
    kernels = {(r["kernel"], r["numel"]) for r in record["results"]}
    assert kernels == {(k, n) for k in ("encode", "decode", "encode_relative", "decode_relative", "clipped_relative", "add")
                       for n in (1024, 4096)}
    assert all(r["gbps"] > 0 and r["path"] == "eager" for r in record["results"])
    assert (out / "codec.md").read_text().startswith("`scalesgd bench codec")
    assert (out / "codec.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_path_is_one_line_exit_2(tmp_path):
    proc = bench("codec", "--paths", "fused", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--paths 'fused' is not known; choose from compiled, eager" in proc.stderr
    assert not (tmp_path / "x").exists()
