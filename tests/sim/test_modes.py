"""Exchange modes by name: each part of `scalesgd-CODEC[@AMOUNT][/WIRE][-ALGORITHM[-BUCKETS]]` and `ddp-CODEC[@RANK]`
read as the run it names, and a mode that names nothing real refused with what is wrong."""

import pytest

from scalesgd.sim.modes import parse_mode


@pytest.mark.parametrize("text, fields", [
    ("scalesgd-lowrank@2/fp16", dict(engine="scalesgd", codec="lowrank", rank=2, wire="fp16", algorithm="ring")),
    ("scalesgd-lowrank/bf16-ring-size:2", dict(codec="lowrank", rank=4, wire="bf16", buckets="size:2")),
    ("scalesgd-lowrank-acp@2/fp16", dict(codec="lowrank-acp", rank=2, wire="fp16")),
    ("ddp-powersgd@8", dict(engine="ddp", codec="powersgd", rank=8, wire="")),
    ("ddp-powersgd", dict(codec="powersgd", rank=4)),
    ("scalesgd-topk@0.01-hierarchical", dict(codec="topk", density=0.01, algorithm="hierarchical")),
    ("scalesgd-topk@0.01/plain-ring", dict(codec="topk", density=0.01, wire="plain", algorithm="ring")),
    ("scalesgd-topk-global@0.1", dict(codec="topk-global", density=0.1)),
    ("scalesgd-fp8-direct", dict(codec="fp8-direct", algorithm="ring", buckets="size:1")),
])
def test_each_part_of_a_mode_is_read(text, fields):
    mode = parse_mode(text)
    assert {key: getattr(mode, key) for key in fields} == fields


def test_a_low_rank_mode_gives_training_its_rank_and_factor_wire():
    assert parse_mode("scalesgd-lowrank@2/fp16").codec_options() == {"density": 0.1, "rank": 2, "factor_wire": "fp16"}
    assert "factor_wire" not in parse_mode("ddp-powersgd@2").codec_options()
    assert parse_mode("scalesgd-topk@0.01/plain").codec_options()["topk_wire"] == "plain"


@pytest.mark.parametrize("text, words", [
    ("scalesgd-lowrank@0", "rank '0' must be a whole number >= 1"),
    ("scalesgd-lowrank@1.5", "rank '1.5' must be a whole number >= 1"),
    ("scalesgd-fp8/fp16", "/fp16 sets lowrank's factor wire or a sparse codec's; fp8 has none"),
    ("scalesgd-lowrank@4/fp9", "wire 'fp9' is not known; choose from fp32, fp16, bf16"),
    ("scalesgd-topk@0.01/fp16", "wire 'fp16' is not known; choose from compact, plain"),
    ("ddp-fp16@2", "@ gives PyTorch's PowerSGD hook its rank; fp16 takes none"),
    ("ddp-powersgd-ring", "a ddp mode is ddp-CODEC[@RANK]"),
    ("scalesgd-topk@-1", "density -1 must be in (0, 1]"),
])
def test_a_mode_that_names_nothing_real_is_refused_with_what_is_wrong(text, words):
    with pytest.raises(ValueError) as caught:
        parse_mode(text)
    assert words in str(caught.value)
