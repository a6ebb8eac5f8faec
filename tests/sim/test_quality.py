"""The steps-to-target table: keys as the simulator names modes, the best-measured row kept, shipped rows read."""

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
    assert quality.to_target(0.5, three) == 0.5 and quality.to_target(0.5, missed) is None


def test_the_shipped_table_has_the_reference_at_one_and_no_peer_among_what_auto_may_choose():
    text = quality.table("text")
    assert text["ddp"].factor == 1.0
    assert all(row.runs >= 1 and (row.factor is None or row.factor > 0) for row in text.values())
