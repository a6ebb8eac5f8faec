"""Calibration from a `bench train` record, and validation: a record the model itself wrote is recovered."""

import json

import pytest

from scalesgd.comm.cost.link import LinkCost
from scalesgd.sim.calibrate import BenchRecord, Calibration, NotABenchDir, golden_min, validate_against
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.exchange import Costs, predict
from scalesgd.sim.modes import parse_mode
from scalesgd.sim.network import Cluster

LAYERS = {"names": ["a", "b", "c"], "sizes": [100_000, 400_000, 500_000], "t_f": 0.1, "t_b": [0.05, 0.1, 0.05]}
RATES = {"100mbit": 12.5e6, "300mbit": 37.5e6, "1gbit": 125e6}
COSTS = {"scalesgd-fp16": Costs(2e-8, 0.0, 0.02), "ddp": Costs(1e-8, 0.0, 0.01)}


def write_record(directory, costs=COSTS):
    """A bench record whose every iteration is what the model predicts with `costs`."""
    profile = ComputeProfile(tuple(LAYERS["names"]), tuple(LAYERS["sizes"]), 0.1, (0.05, 0.1, 0.05), 0.01, 16)
    links, results = [], []
    for rate, speed in RATES.items():
        link = LinkCost(1e-4, speed)
        links.append({"bandwidth": rate, "inter": link.to_dict(), "intra": None})
        results.append({"bandwidth": rate, "mode": "none", "median_iteration_s": 0.31, "mean_compute_s": 0.3,
                        "mean_cpu_s": 0.3})
        for name, cost in costs.items():
            p = predict(parse_mode(name), profile, Cluster(2, 1, link, link), cost)
            results.append({"bandwidth": rate, "mode": name, "median_iteration_s": p.iteration_s,
                            "mean_compute_s": p.compute_s, "mean_cpu_s": 0.3 + cost.exchange_cpu_s})
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.json").write_text(json.dumps({
        "world_size": 2, "config": {"batch_size": 32}, "topology": {"nodes": 2, "procs_per_node": 1},
        "links": links, "layers": LAYERS, "results": results}))
    return directory


def test_calibration_recovers_the_costs_and_validation_finds_no_error(tmp_path):
    record = BenchRecord.load(write_record(tmp_path / "run"))
    calibration = Calibration.of(record)
    assert calibration.profile.compute_s == pytest.approx(0.3) and calibration.profile.t_step == pytest.approx(0.01)
    for name, cost in COSTS.items():
        got = calibration.costs[name]
        assert got.exchange_cpu_s == pytest.approx(cost.exchange_cpu_s)
        assert got.channel_s_per_element == pytest.approx(cost.channel_s_per_element, rel=1e-3)
    points = validate_against(record, calibration)
    assert len(points) == 6 and max(abs(p["error"]) for p in points) < 1e-3


def test_a_directory_that_is_not_a_bench_record_is_named(tmp_path):
    with pytest.raises(NotABenchDir, match="not a `scalesgd bench train` output directory"):
        BenchRecord.load(tmp_path)
    (tmp_path / "train.json").write_text(json.dumps({"results": []}))
    with pytest.raises(NotABenchDir, match="lacks topology, links, layers"):
        BenchRecord.load(tmp_path)


def test_golden_section_finds_a_minimum_and_prefers_the_bound():
    assert golden_min(lambda x: (x - 0.3) ** 2, 0.0, 1.0) == pytest.approx(0.3, abs=1e-6)
    assert golden_min(lambda x: x, 0.0, 1.0) == 0.0


def test_several_calibration_runs_are_averaged(tmp_path):
    other = {"scalesgd-fp16": Costs(4e-8, 0.0, 0.04), "ddp": Costs(3e-8, 0.0, 0.03)}
    records = [BenchRecord.load(write_record(tmp_path / "a")), BenchRecord.load(write_record(tmp_path / "b", other))]
    pooled = Calibration.pooled(records)
    assert pooled.costs["scalesgd-fp16"].exchange_cpu_s == pytest.approx(0.03)
    assert pooled.costs["scalesgd-fp16"].channel_s_per_element == pytest.approx(3e-8, rel=1e-3)
    assert pooled.costs["ddp"].channel_s_per_element == pytest.approx(2e-8, rel=1e-3)
