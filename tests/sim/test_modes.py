"""Exchange modes by name: each part of `scalesgd-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]` and `ddp-CODEC[@RANK]`
read as the run it names, and a mode that names nothing real refused with what is wrong."""

import pytest

from scalesgd.comm.codecs import CodecOptions, LowrankOptions, TopkOptions
from scalesgd.sim.modes import Mode, parse_mode


@pytest.mark.parametrize("text, fields, given", [
    ("scalesgd-lowrank@2/fp16", dict(engine="scalesgd", codec="lowrank", algorithm="ring"),
     {"rank": 2, "factor_wire": "fp16"}),
    ("scalesgd-lowrank/bf16-ring-size:2", dict(codec="lowrank", buckets="size:2"), {"factor_wire": "bf16"}),
    ("scalesgd-lowrank-acp@2/fp16", dict(codec="lowrank-acp"), {"rank": 2, "factor_wire": "fp16"}),
    ("ddp-powersgd@8", dict(engine="ddp", codec="powersgd"), {"rank": 8}),
    ("ddp-powersgd", dict(codec="powersgd"), {}),
    ("scalesgd-topk@0.01-hierarchical", dict(codec="topk", algorithm="hierarchical"), {"density": 0.01}),
    ("scalesgd-topk@0.01/plain-ring", dict(codec="topk", algorithm="ring"), {"density": 0.01, "topk_wire": "plain"}),
    ("scalesgd-topk-global@0.1", dict(codec="topk-global"), {"density": 0.1}),
    ("scalesgd-fp8-direct", dict(codec="fp8-direct", algorithm="ring", buckets="size:1"), {}),
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
])
def test_a_mode_that_names_nothing_real_is_refused_with_what_is_wrong(text, words):
    with pytest.raises(ValueError) as caught:
        parse_mode(text)
    assert words in str(caught.value)
