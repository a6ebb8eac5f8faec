"""`scalesgd bench faults`: a soak of kills restarts as many times and ends bit-identical to an uninterrupted
run, and the table says so (the other scenarios' promises are tested in tests/runtime and tests/train)."""

import json
import subprocess
import sys


def test_a_soak_of_two_kills_restarts_twice_and_ends_bit_identical(tmp_path):
    out = tmp_path / "faults"
    proc = subprocess.run([sys.executable, "-m", "scalesgd", "bench", "faults", "--scenarios", "soak", "--kills", "2",
                           "--workers", "2", "--timeout", "5", "--seed", "16", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200)
    results = {r["scenario"]: r for r in json.loads((out / "faults.json").read_text())["results"]}
    assert proc.returncode == 0, [r["outcome"] for r in results.values()]
    soak = results["soak"]
    assert soak["ok"] and "2 restarts" in soak["outcome"] and "bit-identical" in soak["outcome"]
    assert soak["fault"].startswith("2 SIGKILLs")
    assert sorted(p.name for p in out.iterdir()) == ["faults.json", "faults.md"]  # the runs are cleaned up


def test_unknown_scenario_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "scalesgd", "bench", "faults", "--scenarios", "flood"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "flood" in proc.stderr
