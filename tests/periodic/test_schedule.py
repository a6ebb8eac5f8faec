"""The schedule (H, F, τ): validated in one place, named, parsed and turned into options by itself, the rounds its
exchanges belong to."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalesgd.periodic.schedule import Schedule


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.data())
def test_its_name_parses_back_and_its_options_build_it_again(period, fragments, data):
    schedule = Schedule(period * fragments, fragments, data.draw(st.integers(0, period - 1)))
    assert Schedule.parse(schedule.name) == schedule
    assert Schedule(**schedule.options()) == schedule
    assert Schedule.of({**schedule.options(), "mix": 0.5, "codec": "fp8"}) == schedule


def test_the_name_is_the_shortest_that_says_it():
    assert [Schedule(16).name, Schedule(16, 4).name, Schedule(16, 4, 1).name, Schedule(16, 1, 3).name] == [
        "16", "16/4", "16/4/1", "16/1/3"]
    assert Schedule(16, 4, 1).describe() == "every 16 steps, 4 fragments 1 step behind"
    assert Schedule(16).describe() == "every 16 steps"
    assert Schedule.of({"local_steps": 0, "fragments": 1}) is None  # a run exchanging every step


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.data())
def test_each_landing_and_its_start_belong_to_the_same_round(period, fragments, data):
    schedule = Schedule(period * fragments, fragments, data.draw(st.integers(0, period - 1)))
    rounds: dict[int, list[int]] = {}
    for step in range(1, 4 * schedule.local_steps + 1):
        landed = schedule.lands(step)
        if landed is not None:
            rounds.setdefault(landed, []).append(schedule.round_of(step))
            started = step - schedule.overlap_steps
            if started >= 1:
                assert schedule.starts(started) == landed
                assert schedule.round_of(started + schedule.overlap_steps) == schedule.round_of(step)
    assert all(numbers == [0, 1, 2, 3] for numbers in rounds.values())


@pytest.mark.parametrize("args,error,words", [
    ((1.5,), TypeError, "local_steps 1.5: give a whole number"),
    (("16",), TypeError, "local_steps '16': give a whole number"),
    ((True,), TypeError, "local_steps True"),
    ((0,), ValueError, "local_steps 0: give 1 to"),
    ((8, 3), ValueError, "fragments 3: give a divisor of local_steps 8"),
    ((8, 2, 4), ValueError, r"overlap_steps 4: give 0 to 3 \(a fragment's exchange lands before"),
    ((8, 2, -1), ValueError, "overlap_steps -1"),
])
def test_what_cannot_run_is_refused_naming_the_argument(args, error, words):
    with pytest.raises(error, match=words):
        Schedule(*args)


@pytest.mark.parametrize("text", ["", "16/", "a", "16/4/1/2", "-4"])
def test_a_name_that_is_no_schedule_says_what_one_is(text):
    with pytest.raises(ValueError, match=r"give H\[/F\[/τ\]\]"):
        Schedule.parse(text)


def test_more_fragments_than_layers_is_a_problem_it_names():
    assert Schedule(64, 64).fits(19) == ("fragments 64: the model has 19 layers with parameters; give 1 to 19 "
                                         "dividing local_steps 64")
    assert Schedule(64, 16).fits(19) is None
