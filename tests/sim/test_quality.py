"""The steps-to-target table: keys as the simulator names modes, the best-measured row kept, shipped rows read."""

from dataclasses import replace

import pytest

from scalesgd.periodic.schedule import Schedule
from scalesgd.sim import quality
from scalesgd.sim.modes import parse_mode
from scalesgd.sim.quality import StepsToTarget


def test_keys_name_the_exchange_without_its_amounts():
    assert quality.key_of("ddp", "fp32") == "ddp" and quality.key_of("ddp", "powersgd") == "ddp-powersgd"
    assert quality.key_of("scalesgd", "fp8") == "scalesgd-fp8"
    assert quality.key_of("scalesgd", "fp8", Schedule(16)) == "periodic@16-fp8"
    assert quality.key_of("scalesgd", "fp8", Schedule(16, 4, 3)) == "periodic@16/4/3-fp8"
    assert quality.key_of("scalesgd", "fp8", Schedule(16, 4)) == "periodic@16/4-fp8"
    assert quality.key_of("scalesgd", "fp32", Schedule(10), peer="torchft") == "torchft:periodic@10-fp32"
    assert quality.key_of("scalesgd", "fp8", Schedule(16), optimizer="muon") == "periodic@16-fp8+muon"
    assert quality.mode_key(parse_mode("periodic@16/4/3-fp8")) == "periodic@16/4/3-fp8"
    assert quality.mode_key(parse_mode("ddp-powersgd@4")) == "ddp-powersgd"


def test_merging_keeps_the_row_over_most_runs_and_the_table_round_trips(tmp_path):
    one = StepsToTarget("scalesgd-fp8", "--codec fp8", 1.1, 2.3, 1, "a")
    three = StepsToTarget("scalesgd-fp8", "--codec fp8", 1.0, 2.2, 3, "b")
    missed = StepsToTarget("ddp-powersgd", "--codec powersgd", None, 2.35, 1, "a")
    rows = quality.merged([{one.key: three}, {one.key: one, missed.key: missed}])
    assert rows == {one.key: three, missed.key: missed}
    path = tmp_path / "steps.json"
    quality.write({"text": rows, "image": {}}, path)
    assert quality.table("text", path) == rows and quality.table("image", path) == {}
    muon = StepsToTarget("scalesgd-fp8+muon", "--codec fp8 --optimizer muon", 0.8, 2.0, 1, "c")
    quality.write({"text": {**rows, muon.key: muon}}, path)
    assert quality.table("text", path) == rows  # another optimizer's rows: not the recipe's
    assert quality.table("text", path, optimizer="muon") == {"scalesgd-fp8": replace(muon, key="scalesgd-fp8")}
    assert quality.other_optimizers("text", path) == ["muon"] and quality.other_optimizers("image", path) == []
    assert quality.to_target(0.5, three) == 0.5 and quality.to_target(0.5, missed) is None


def test_under_another_optimizer_a_per_step_row_steps_as_ddp_does_under_it_unless_measured(tmp_path):
    ddp = StepsToTarget("ddp", "", 1.0, 2.2, 3, "a", by_workers={8: 1.0})
    fp8 = StepsToTarget("scalesgd-fp8", "--codec fp8", 1.2, 2.2, 3, "b", by_workers={4: 1.1})
    topk = StepsToTarget("scalesgd-topk", "--codec topk", None, 2.4, 3, "b")
    diloco = StepsToTarget("periodic@16-fp8", "--local-steps 16", 1.5, 2.2, 3, "c")
    ddp_muon = StepsToTarget("ddp+muon", "--optimizer muon", 0.8, 2.1, 1, "d", workers=8)
    fp16_muon = StepsToTarget("scalesgd-fp16+muon", "--codec fp16 --optimizer muon", 0.9, 2.1, 1, "e")
    path = tmp_path / "steps.json"
    rows = {r.key: r for r in (ddp, fp8, topk, diloco, ddp_muon, fp16_muon)}
    quality.write({"text": rows}, path)
    muon = quality.table("text", path, optimizer="muon")
    assert muon["ddp"] == replace(ddp_muon, key="ddp") and muon["scalesgd-fp16"].factor == 0.9  # measured: as is
    assert muon["scalesgd-fp8"].factor == pytest.approx(1.2 * 0.8)  # the codec's cost in steps × DDP's under Muon
    assert muon["scalesgd-fp8"].by_workers == {4: pytest.approx(1.1 * 0.8)}
    assert muon["scalesgd-fp8"].source == "b × ddp+muon"
    assert muon["scalesgd-topk"].missed  # missed under the recipe: not assumed to reach it under another
    assert "periodic@16-fp8" not in muon  # a periodic row's steps under an optimizer are only as measured
    del rows["ddp+muon"]
    quality.write({"text": rows}, path)
    assert set(quality.table("text", path, optimizer="muon")) == {"scalesgd-fp16"}  # no DDP to step as


def test_the_shipped_table_has_the_reference_at_one_and_no_peer_among_what_auto_may_choose():
    text = quality.table("text")
    assert text["ddp"].factor == 1.0
    assert all(row.runs >= 1 and (row.factor is None or row.factor > 0) for row in text.values())


def test_rows_at_other_worker_counts_fold_into_one_and_round_trip(tmp_path):
    two = StepsToTarget("periodic@16-fp8", "--local-steps 16", 1.0, 2.1, 3, "a")
    eight = StepsToTarget("periodic@16-fp8", "--local-steps 16", 1.44, 2.2, 3, "b", workers=8)
    four = StepsToTarget("periodic@16-fp8", "--local-steps 16", 1.2, 2.15, 1, "c", workers=4)
    rows = quality.merged([{two.key: two}, {eight.key: eight}, {four.key: four}])
    assert rows[two.key].factor == 1.0 and rows[two.key].by_workers == {4: 1.2, 8: 1.44}
    again = quality.merged([rows, {two.key: StepsToTarget(two.key, "", 1.3, 2.2, 3, "d", workers=4)}])
    assert again[two.key].by_workers == {4: 1.3, 8: 1.44}  # measured again at 4: the new row's
    path = tmp_path / "steps.json"
    quality.write({"text": again, "image": {}}, path)
    assert quality.table("text", path) == again


def test_a_power_law_in_workers_reads_measured_counts_as_they_are_and_predicts_the_others():
    row = StepsToTarget("periodic@16-fp8", "", 1.0, 2.1, 3, "a", by_workers={4: 1.2})
    assert row.at(2).factor == 1.0 and row.at(4).factor == 1.2 and row.at(4).by_workers == {}
    assert abs(row.at(8).factor - 1.44) < 1e-12 and abs(row.at(1024).factor - 1.2 ** 9) < 1e-9  # 1.2× a doubling
    law = quality.scaling_in_workers({2: 1.0, 4: 1.1, 8: 1.3})
    assert abs(law.exponent - 0.1892) < 1e-3 and law(16) > 1.3  # least squares in log–log, increasing
    assert StepsToTarget("k", "", 1.1, 2.1, 3, "a").at(64).factor == 1.1  # one count: no dependence known
    missed = StepsToTarget("k", "", 1.0, 2.1, 3, "a", by_workers={8: None})
    assert missed.at(8).missed and missed.at(16).missed and missed.at(4).factor == 1.0  # missed at 8: past it too


def test_a_periodic_row_measured_at_one_count_borrows_the_exponent_of_those_measured_at_several(tmp_path):
    """No prediction holds a periodic mode flat in M: streaming measured at 2 workers grows as DiLoCo's law does; a
    per-step exchange stays as DDP at any M; the borrowed exponent is read, never written."""
    diloco = StepsToTarget("periodic@16-fp8", "", 1.0, 2.1, 3, "a", by_workers={4: 1.2})
    streaming = StepsToTarget("periodic@16/4/3-fp8", "", 1.1, 2.1, 3, "a")
    per_step = StepsToTarget("scalesgd-fp8", "", 1.0, 2.2, 3, "a")
    path = tmp_path / "steps.json"
    quality.write({"text": {r.key: r for r in (diloco, streaming, per_step)}, "image": {}}, path)
    assert "borrowed" not in path.read_text() and "basis" not in path.read_text()
    rows = quality.table("text", path)
    at8 = rows[streaming.key].at(8)
    assert abs(at8.factor - 1.1 * 1.44) < 1e-9 and at8.basis == "borrowed"
    assert rows[streaming.key].at(2).factor == 1.1 and rows[streaming.key].at(2).basis == "measured"
    assert rows[diloco.key].at(8).basis == "fitted"
    assert rows[per_step.key].at(64).factor == 1.0 and rows[per_step.key].at(64).basis == "per step"
    alone = {streaming.key: streaming}  # nothing measured at several counts: nothing to borrow
    quality.write({"text": alone, "image": {}}, path)
    assert quality.table("text", path)[streaming.key].at(8).basis == "as at 2"
