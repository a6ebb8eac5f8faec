"""The seeds' presets reproduce their headline numbers from published parameters (docs/SIMULATE.md)."""

import pytest

from scalesgd.sim import presets, scaling
from scalesgd.sim.modes import parse_mode


def headline(name):
    preset = presets.PRESETS[name]
    rows = scaling.rows(preset.profile(), preset.cluster(), [parse_mode(m) for m in preset.modes],
                        list(preset.workers), preset.costs())
    return preset.headline(rows), rows


@pytest.mark.parametrize("name", ["goyal", "oyama"])
def test_presets_within_20_percent_of_the_published_headline(name):
    result, _ = headline(name)
    assert abs(result["error"]) <= 0.20, result


def test_oyama_takes_the_summing_cost_from_the_half_over_fp8_ratio_only():
    _, rows = headline("oyama")
    at16 = {r["mode"]: r["iteration_s"] for r in rows if r["workers"] == 16}
    assert at16[presets.OYAMA_FP16] / at16[presets.OYAMA_FP8] == pytest.approx(1.56, rel=1e-3)


def test_fujitsu_projects_every_mode_at_2048_gpus():
    result, rows = headline("fujitsu")
    assert result["predicted"] > 0 and {r["mode"] for r in rows if r["workers"] == 2048} == set(
        presets.FUJITSU.modes)
