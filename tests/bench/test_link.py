"""`scalesgd bench link` end to end on two local workers: its figures, its α/β fit and its PNG."""

import json

from tests.bench.cli import bench


def test_bench_link_writes_json_markdown_and_a_png_of_time_against_size(tmp_path):
    out = tmp_path / "bench"
    proc = bench("link", "--workers", "2", "--megabytes", "8", "--repeats", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "link.json").read_text())["result"]
    assert result["peer_rank"] == 1 and result["rtt_ms"] > 0 and result["one_way_mbit_s"] > 0
    assert [p["bytes"] for p in result["one_way"]] == [4, 1 << 17, 1 << 19, 1 << 21, 1 << 23]  # ping, 1/64 … 8 MiB
    assert result["fit"]["alpha_s"] == result["one_way"][0]["seconds"] > 0 and result["fit"]["bytes_per_s"] > 0
    assert (out / "link.md").read_text().startswith("`scalesgd bench link")
    png = (out / "link.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR" and len(png) > 10_000
    assert "link.{json,md,png}" in proc.stdout
