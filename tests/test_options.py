"""Options declared once as config fields: the parser, its help and the checks all come from the fields."""

import argparse
import math
from dataclasses import dataclass

import pytest

from scalesgd import checks
from scalesgd.errors import UsageError
from scalesgd.options import (
    OptionParser,
    add_options,
    check_fields,
    floats_of,
    given,
    help_of,
    ints,
    option,
    option_fields,
    parse,
    record,
    refuse,
    runtime_fields,
    sizes,
)


@dataclass
class Toy:
    """A config with one option of every kind."""

    count: int = option(3, "how many", check=checks.positive, group="numbers")
    rate: float = option(0.5, check=checks.within(0, 1))
    colour: str = option("red", "a colour", choices=("red", "green"))
    tags: tuple[int, ...] = option((1, 2), parse=ints, check=checks.distinct)
    loud: bool = option(False, "shout")
    quiet_mode: bool = option(True, "keep quiet", flag="--no-quiet-mode")
    where: str = option("", "output", shown_default="runs/<stamp>", runtime=True)
    rest: tuple[str, ...] = option((), "-- then anything", remainder=True)


def test_every_field_becomes_its_option_and_only_given_ones_are_set():
    values = parse(Toy, ["--count", "5", "--tags", "3,4", "--loud", "--no-quiet-mode", "--", "--x", "y"], "toy")
    assert values == {"count": 5, "tags": (3, 4), "loud": True, "quiet_mode": False, "rest": ("--x", "y")}
    assert Toy(**values) == Toy(count=5, tags=(3, 4), loud=True, quiet_mode=False, rest=("--x", "y"))
    assert parse(Toy, [], "toy") == {"rest": ()}


def test_help_lists_choices_and_defaults_and_groups_follow_the_fields():
    fields = {f.name: f for f in option_fields(Toy)}
    assert help_of(fields["colour"]) == "red | green: a colour (default red)"
    assert help_of(fields["tags"]) == "(default 1,2)"
    assert help_of(fields["where"]) == "output (default runs/<stamp>)"
    assert help_of(fields["loud"]) == "shout"
    parser = OptionParser(prog="toy")
    add_options(parser, Toy)
    assert "numbers" in [g.title for g in parser._action_groups]


def test_checks_and_choices_name_the_field():
    check_fields(Toy())
    for bad, expected in ((Toy(count=0), "`count` 0: must be a positive number"),
                          (Toy(colour="blue"), "`colour` 'blue' is not known; choose from red, green"),
                          (Toy(tags=(1, 1)), "`tags` 1,1: give each value once")):
        with pytest.raises(UsageError) as err:
            check_fields(bad)
        assert str(err.value) == expected


def test_a_bad_option_is_a_usage_error_not_an_exit():
    with pytest.raises(UsageError, match="toy: argument --count: invalid int value: 'x'"):
        parse(Toy, ["--count", "x"], "toy")
    with pytest.raises(UsageError, match="unrecognized arguments: --nope"):
        parse(Toy, ["--nope"], "toy")


def test_a_true_default_needs_a_no_flag():
    @dataclass
    class Wrong:
        on: bool = option(True, "on")

    with pytest.raises(ValueError, match="--no-"):
        add_options(OptionParser(prog="x"), Wrong)


def test_records_runtime_fields_and_list_parsers():
    assert record(Toy())["tags"] == [1, 2] and runtime_fields(Toy) == {"where"}
    assert sizes("256,4K,1M") == (256, 4096, 1 << 20)
    assert given(OptionParser().parse_args([])) == {}


def test_every_number_option_is_finite_unless_it_says_otherwise():
    @dataclass
    class Numbers:
        rate: float = option(0.5)
        sizes: tuple[float, ...] = option((1.0,), parse=floats_of("sizes"))
        count: int = option(1)
        wild: float = option(0.0, nonfinite=True)

    check_fields(Numbers(wild=math.nan))
    for bad, expected in ((Numbers(rate=math.nan), "`rate` nan: must be a finite number"),
                          (Numbers(sizes=(1.0, math.inf)), "`sizes` 1.0,inf: must be a finite number"),
                          (Numbers(count=10**30), "`count` 1000000000000000000000000000000: must lie within")):
        with pytest.raises(UsageError) as err:
            check_fields(bad)
        assert str(err.value).startswith(expected)


def test_the_option_s_own_check_words_it_first_and_refuse_words_any():
    @dataclass
    class Rate:
        rate: float = option(0.5, check=checks.positive)

    with pytest.raises(UsageError, match="`rate` nan: must be a positive number"):
        check_fields(Rate(rate=math.nan))
    refuse("rate", 1, None)
    with pytest.raises(UsageError, match="^`rates` 1,2: too many$"):
        refuse("rates", (1, 2), "too many")


def test_an_infinite_size_is_a_parse_error():
    with pytest.raises(argparse.ArgumentTypeError, match="is not a list of element counts"):
        sizes("infK")
