"""`scalesgd bench allreduce` end to end on two local workers."""

import json

from tests.bench.cli import bench


def test_bench_allreduce_writes_json_markdown_and_png_for_every_algorithm(tmp_path):
    out = tmp_path / "bench"
    proc = bench("allreduce", "--workers", "2", "--sizes", "0,5,1K", "--algorithms",
                 "ring,halving_doubling,hierarchical,native", "--procs-per-node", "1", "--repeats", "2",
                 "--warmup", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "allreduce.json").read_text())
    assert record["world_size"] == 2 and record["machine"]["torch"]
    points = {(r["algorithm"], r["numel"]) for r in record["results"]}
    assert points == {(a, n) for a in ("ring", "halving_doubling", "hierarchical", "native") for n in (0, 5, 1024)}
    assert all(r["correct"] and 0 < r["min_s"] <= r["median_s"] <= r["max_s"] for r in record["results"])
    for r in record["results"]:  # the speed-up over native, per repetition, with its spread
        assert r["speedup"]["min"] <= r["speedup"]["median"] <= r["speedup"]["max"]
    assert all(r["speedup"]["median"] == 1.0 for r in record["results"] if r["algorithm"] == "native")
    ring_1k = next(r for r in record["results"] if r["algorithm"] == "ring" and r["numel"] == 1024)
    assert ring_1k["bytes"] == 4096 and ring_1k["bytes_sent"] == 4096  # 2·(p−1)/p of the vector
    markdown = (out / "allreduce.md").read_text()
    assert markdown.startswith("`scalesgd bench allreduce") and "| halving_doubling |" in markdown
    assert (out / "allreduce.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_algorithm_is_one_line_exit_2(tmp_path):
    proc = bench("allreduce", "--algorithms", "ring,tree", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert ("--algorithms 'tree' is not known; choose from ring, halving_doubling, hierarchical, native, fp32, "
            "fp16, bf16, fp8, fp8-direct, fp8-flat") in proc.stderr
    assert not (tmp_path / "x").exists()


def test_compressed_exchanges_are_timed_beside_native_on_two_nodes(tmp_path):
    out = tmp_path / "bench"
    proc = bench("allreduce", "--workers", "4", "--procs-per-node", "2", "--sizes", "7,1K", "--algorithms",
                 "native,fp16,fp8,fp8-flat", "--repeats", "1", "--warmup", "0", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "allreduce.json").read_text())["results"]
    assert {r["algorithm"] for r in results} == {"native", "fp16", "fp8", "fp8-flat"}
    assert all(r["correct"] for r in results)
    sent = {r["algorithm"]: r["bytes_sent"] for r in results if r["numel"] == 1024}
    assert sent["fp16"] * 2 == sent["native"]
    # two-stage fp8 of 1,024 one-byte elements, a non-finite flag and a saturation flag (1,026 bytes) on
    # 2 × 2: half to the node peer, the other half's reduce-scatter and allgather across nodes, the half back
    assert sent["fp8"] == 3 * 513


def test_compressed_exchanges_need_float32(tmp_path):
    proc = bench("allreduce", "--algorithms", "fp8", "--dtype", "float16", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--algorithms fp8 compress float32 gradients; use --dtype float32" in proc.stderr
