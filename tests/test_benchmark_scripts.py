"""The pieces of the benchmark scripts in docs/benchmarks that are ours to get wrong: the delay forwarders' cost
over a run, and the held-out check of steps to the target against the number of workers."""

import importlib.util
import io
import json
import lzma
import subprocess
import tarfile
from dataclasses import asdict
from pathlib import Path

from scalesgd.sim.quality import StepsToTarget

HERE = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "quality-gpt-workers"


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_forwarders_cost_is_their_cpu_over_the_bytes_and_the_wall_clock_between_two_snapshots():
    cost = script("forwarders").cost({"forwarders": 8, "cpu_s": 10.0, "carried_bytes": 0, "at": 100.0},
                                     {"forwarders": 8, "cpu_s": 16.0, "carried_bytes": 2e8, "at": 400.0})
    assert cost == {"forwarders": 8, "cpu_s": 6.0, "carried_gb": 0.2, "wall_s": 300.0, "core_share": 0.02,
                    "cpu_s_per_gb": 30.0}


def test_the_fit_on_fewer_workers_predicts_the_most_workers_measured(tmp_path, capsys):
    for m, factor in ((4, 1.2), (8, 1.5)):
        row = StepsToTarget("periodic@16-fp8", "--local-steps 16", factor, 2.2, 3, f"m{m}", workers=m)
        data = json.dumps({"steps_to_target": {row.key: asdict(row)}}).encode()
        (tmp_path / f"m{m}" / "calls").mkdir(parents=True)
        if m == 8:  # a call's record as run.sh keeps it
            (tmp_path / "m8" / "calls" / "0-fp8-h16.json.xz").write_bytes(lzma.compress(data))
            continue
        info = tarfile.TarInfo("quality.json")  # an older directory: the last call's record alone
        info.size = len(data)
        with tarfile.open(tmp_path / f"m{m}" / "raw.tar.xz", "w:xz") as tar:
            tar.addfile(info, io.BytesIO(data))
    script("fit").main([str(tmp_path / "m4"), str(tmp_path / "m8"), "--picture", str(tmp_path / "fit.png")])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    held = next(line for line in lines if line.get("held_out") == 8 and line["key"] == "periodic@16-fp8")
    shipped = next(line for line in lines if "factor_by_workers" in line and line["key"] == "periodic@16-fp8")
    two = shipped["factor_by_workers"]["2"]  # the shipped table's, at 2 workers
    assert held["fit_on"] == [2, 4] and abs(held["predicted"] - 1.2 ** 2 / two) < 1e-3  # 1.2/two a doubling
    assert held["measured"] == 1.5 and (tmp_path / "fit.png").read_bytes()[:4] == b"\x89PNG"  # drawn where asked


def test_the_run_scripts_parse():
    for folder in ("quality-gpt-workers", "gpu-h200-workers", "muon-cpu"):
        script_path = HERE.parent / folder / "run.sh"
        assert subprocess.run(["bash", "-n", str(script_path)]).returncode == 0, script_path


def test_the_picture_draws_each_exchange_from_the_call_with_most_seeds_and_a_miss_at_the_budget(tmp_path, capsys):
    def call(directory, name, seeds, times, reached, workers):
        record = {"reference": [{"workers": workers}], "compute_bound_s": 50.0, "budget_s": 150.0,
                  "summary": [{"rate": "10mbit@25ms", "label": "fp8-h16", "seeds": seeds, "reached": reached,
                               "time_s": times}]}
        (tmp_path / directory / "calls").mkdir(parents=True, exist_ok=True)
        (tmp_path / directory / "calls" / f"{name}.json.xz").write_bytes(lzma.compress(json.dumps(record).encode()))

    call("m8", "0-fp8-h16", 1, [90.0], 1, 8)
    call("m8", "012-fp8-h16", 3, [100.0, 120.0, 110.0], 3, 8)  # three seeds: drawn over the one
    call("m4", "012-fp8-h16", 3, [80.0], 1, 4)  # one seed of three reached: a miss
    script("picture").main([str(tmp_path / "m4"), str(tmp_path / "m8"), "--picture", str(tmp_path / "t.png")])
    drawn = {p["workers"]: p for p in map(json.loads, capsys.readouterr().out.splitlines())}
    assert (drawn[8]["time_s"], drawn[8]["min_s"], drawn[8]["max_s"], drawn[8]["seeds"]) == (110.0, 100.0, 120.0, 3)
    assert drawn[4]["time_s"] is None and drawn[4]["budget_s"] == 150.0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
