"""Exchange modes by name: each part of `scalesgd-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]` and `ddp-CODEC[@RANK]`
read as the run it names, and a mode that names nothing real refused with what is wrong."""

import pytest

from scalesgd.comm.codecs import CodecOptions, LowrankOptions, TopkOptions
from scalesgd.comm.engine.exchange import exchange_names
from scalesgd.errors import UsageError
from scalesgd.sim.modes import Mode, parse_mode


@pytest.mark.parametrize("text, fields, given", [
    ("scalesgd-lowrank@2/fp16", {"engine": "scalesgd", "codec": "lowrank", "algorithm": "ring"},
     {"rank": 2, "factor_wire": "fp16"}),
    ("scalesgd-lowrank/bf16-ring-size:2", {"codec": "lowrank", "buckets": "size:2"}, {"factor_wire": "bf16"}),
    ("scalesgd-lowrank-acp@2/fp16", {"codec": "lowrank-acp"}, {"rank": 2, "factor_wire": "fp16"}),
    ("ddp-powersgd@8", {"engine": "ddp", "codec": "powersgd"}, {"rank": 8}),
    ("ddp-powersgd", {"codec": "powersgd"}, {}),
    ("scalesgd-topk@0.01-hierarchical", {"codec": "topk", "algorithm": "hierarchical"}, {"density": 0.01}),
    ("scalesgd-topk@0.01/plain-ring", {"codec": "topk", "algorithm": "ring"}, {"density": 0.01, "topk_wire": "plain"}),
    ("scalesgd-topk-global@0.1", {"codec": "topk-global"}, {"density": 0.1}),
    ("scalesgd-fp8-direct", {"codec": "fp8-direct", "algorithm": "ring", "buckets": "size:1"}, {}),
    ("scalesgd-topk@1e-05", {"codec": "topk", "algorithm": "ring"}, {"density": 1e-05}),  # the exponent's own sign
    ("scalesgd-topk@1E-3-hierarchical-size:2", {"algorithm": "hierarchical", "buckets": "size:2"}, {"density": 1e-3}),
    ("scalesgd-lowrank@4/fp16-ring-planner:dlgs", {"buckets": "planner:dlgs"}, {"rank": 4, "factor_wire": "fp16"}),
    ("auto-fp16+topk+ddp-powersgd@0.01", {"engine": "auto", "codec": "fp16+topk+ddp-powersgd"}, {"density": 0.01}),
    ("auto", {"engine": "auto"}, {}),
    ("scalesgd", {"engine": "scalesgd", "codec": "fp32", "algorithm": "ring", "buckets": "size:1"}, {}),
])
def test_each_part_of_a_mode_is_read(text, fields, given):
    mode = parse_mode(text)
    assert {key: getattr(mode, key) for key in fields} == fields
    assert mode.codec_options() == given


def test_a_mode_runs_with_every_codec_option_the_simulator_reads():
    mode = parse_mode("scalesgd-lowrank@2/fp16")
    assert (mode.options["lowrank"].rank, mode.options["lowrank"].factor_wire) == (2, "fp16")
    assert mode.options["lowrank"].min_rate == LowrankOptions().min_rate  # the rest at their defaults
    run = CodecOptions.of(LowrankOptions(min_rate=8.0), TopkOptions(density=0.02))
    auto = Mode("lowrank", "scalesgd", "lowrank", base=run)  # --exchange auto's candidate: the run's own options
    assert auto.options["lowrank"].min_rate == 8.0 and auto.options["topk"].density == 0.02


@pytest.mark.parametrize("text, words", [
    ("scalesgd-lowrank@0", "rank 0: must be in [1, 65536]"),  # the option's own check
    ("scalesgd-lowrank@70000", "rank 70000: must be in [1, 65536]"),
    ("scalesgd-lowrank@1.5", "rank '1.5' is not a whole number"),
    ("scalesgd-lowrank@", "give its rank after the @"),
    ("scalesgd-lowrank@4/", "give its factor_wire after the /"),
    ("scalesgd-fp8/fp16", "fp8 takes no /WIRE; lowrank, lowrank-acp, topk"),
    ("scalesgd-lowrank@4/fp9", "factor_wire 'fp9' is not known; choose from fp32, fp16, bf16, fp8"),
    ("scalesgd-topk@0.01/fp16", "topk_wire 'fp16' is not known; choose from compact, plain"),
    ("ddp-fp16@2", "fp16 takes no @AMOUNT; under ddp powersgd, lowrank"),
    ("ddp-powersgd-ring", "a ddp mode is ddp-CODEC[@RANK]"),
    ("scalesgd-topk@-1", "density -1.0: must be in (0, 1]"),
    ("scalesgd-fp7", "codec 'fp7' is not known; choose from fp32"),
    # every part a name shows is one the mode runs with: none left empty, none ignored
    ("scalesgd-", "give its codec after the -; choose from fp32"),
    ("ddp-", "give its codec after the -; choose from fp32"),
    ("scalesgd-@4", "give its codec after the -"),  # was "codec '@4' is not known"
    ("scalesgd--ring", "give its codec after the -"),  # was "`algorithm` 'g' is not known"
    ("scalesgd-fp32-", "give its algorithm after the -, or end the mode before it"),
    ("scalesgd-lowrank@4-", "give its algorithm after the -"),
    ("scalesgd-fp32--size:2", "give its algorithm after the -"),
    ("scalesgd-fp32-ring-", "give its buckets after the -, or end the mode before it"),
    ("scalesgd-topk@0.01/", "give its topk_wire after the /"),
    ("scalesgd-topk@1e-ring", "density '1e' is not a number"),  # the exponent's dash takes digits only
    ("auto@", "give its density after the @"),
    ("auto-bogus+fp32", "exchange 'bogus' is not known; choose from fp32, fp16, "),
    ("auto-", "give its exchanges after the -; choose from fp32"),
    ("auto-fp32+", "an exchange is missing in 'fp32+'; choose from fp32"),
    ("auto@0.1", "@DENSITY sets the density of its sparse exchanges and it has none; topk, "),  # no sparse default
    ("auto-fp32+ddp-fp16@0.1", "@DENSITY sets the density of its sparse exchanges and it has none; topk, "),
    ("none-x", "mode 'none-x' is not known; use none, ddp"),
    ("", "mode '' is not known"),
])
def test_a_mode_that_names_nothing_real_is_refused_with_what_is_wrong(text, words):
    with pytest.raises(UsageError) as caught:  # bad input: one line, exit status 2
        parse_mode(text)
    assert words in str(caught.value)


@pytest.mark.parametrize("text", ["auto-bogus+fp32", "auto-", "auto-fp32+", "auto-+"])
def test_an_auto_mode_naming_no_known_exchange_lists_every_exchange_it_accepts(text):
    with pytest.raises(UsageError) as caught:
        parse_mode(text)
    assert str(caught.value).endswith(f"; choose from {', '.join(exchange_names())}"), str(caught.value)
    assert "ddp-powersgd" in exchange_names()
