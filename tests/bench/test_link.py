"""`scalesgd bench link` end to end on two local workers: its figures, its α/β fit and its PNG."""

import json

import numpy as np
import pytest

from tests.bench.cli import bench


def test_bench_link_writes_json_markdown_and_a_png_of_time_against_size(tmp_path):
    out = tmp_path / "bench"
    proc = bench("link", "--workers", "2", "--megabytes", "8", "--repeats", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "link.json").read_text())["result"]
    assert result["peer_rank"] == 1
    assert [p["bytes"] for p in result["one_way"]] == [4, 1 << 17, 1 << 19, 1 << 21, 1 << 23]  # ping, 1/64 … 8 MiB
    ping, largest = result["one_way"][0], result["one_way"][-1]
    assert result["fit"]["alpha_s"] == ping["seconds"] == pytest.approx(result["rtt_ms"] / 2e3)  # half a round trip
    assert result["one_way_mbit_s"] == pytest.approx(8 * largest["bytes"] / largest["seconds"] / 1e6)
    assert 50 < result["one_way_mbit_s"] < 1e6  # loopback: 8 MiB in well under 1.3 s, but not under 67 µs
    # 1/β: the least-squares seconds per byte of the larger messages' time beyond α (a line through the ping)
    sizes = np.array([[p["bytes"]] for p in result["one_way"][1:]], dtype=float)
    beyond = np.array([p["seconds"] for p in result["one_way"][1:]]) - ping["seconds"]
    assert result["fit"]["bytes_per_s"] == pytest.approx(1 / np.linalg.lstsq(sizes, beyond, rcond=None)[0][0])
    assert (out / "link.md").read_text().startswith("`scalesgd bench link")
    png = (out / "link.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR" and len(png) > 10_000
    assert "link.{json,md,png}" in proc.stdout
