"""`bench elastic`'s reading of a run: the spread it prints, and the seconds it takes from the members' logs."""

from scalesgd.bench.elastic import outcome, spread


def test_the_spread_is_the_median_with_min_and_max_and_a_dash_for_nothing():
    assert spread([3.0, 1.0, 2.0]) == "2.00 (1.00–3.00)"
    assert spread([None, 4.0]) == "4.00"
    assert spread([None]) == "—"


def _entry(at, members, retries=0, seconds=0.04, digest="d"):
    return {"at": at, "members": members, "retries": retries, "seconds": seconds, "digest": digest}


def test_the_seconds_are_to_the_first_round_without_the_faulty_worker_and_back_with_it():
    three, two = ["w0-a", "w1-b", "w2-c"], ["w0-a", "w1-b"]
    log = [_entry(10.0, three), _entry(10.5, three), _entry(11.7, two, retries=1, seconds=1.2),
           _entry(13.0, two), _entry(14.4, ["w0-a", "w1-b", "w2-d"])]
    logs = {"w0": {"log": log, "rounds": 5, "digest": "x"}, "w1": {"log": log, "rounds": 5, "digest": "x"}}
    result = outcome("stop", 0, logs, fault=10.4, back=14.0, faulty="w2")
    assert round(result.to_round_s, 6) == 1.3 and round(result.back_s, 6) == 0.4
    assert (result.rounds, result.retries, result.round_s, result.equal) == (5, 1, 0.04, True)
    logs["w1"] = {**logs["w1"], "digest": "y"}
    assert not outcome("stop", 0, logs, 10.4, 14.0, "w2").equal
