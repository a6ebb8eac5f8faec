"""SparseLoCo's codec: decayed error feedback (e ← β·e + Δ, what travels leaves it), its registration's facts and
recipe (plain averaging as the outer step), and the bytes it saves against fp8 on the same bucket."""

import pytest
import torch

from scalesgd.comm.codecs import CODECS, BucketView, CodecSettings, make_codec
from scalesgd.comm.codecs.sparseloco import SparseLocoOptions
from scalesgd.config.train import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.recipe.defaults import brought

VIEW = BucketView(0, [], [0], 20_000)


def residual(codec) -> torch.Tensor:
    regions = codec.state_dict()["flat"]["regions"]
    return regions[0]["residual"] if regions else torch.zeros(VIEW.numel)


@pytest.mark.parametrize("decay", [0.95, 0.0, 1.0])
def test_the_error_feedback_decays_by_beta_and_owes_exactly_what_did_not_travel(decay):
    codec = make_codec("sparseloco", CodecSettings(SparseLocoOptions(chunk=1024, top=16, decay=decay)))
    g = torch.Generator().manual_seed(0)
    for step in range(4):
        delta = torch.randn(VIEW.numel, generator=g) * (1 + step)
        accumulated = residual(codec) * decay + delta
        idx, values, flagged = codec.sparsify(delta.clone(), VIEW, 2)
        sent = torch.zeros(VIEW.numel).index_put_((idx.long(),), values)
        assert not flagged and idx.numel() == 16 * 20 - 16 + min(16, 20_000 - 19 * 1024)
        assert torch.equal(residual(codec) + sent, accumulated)


def test_a_pseudo_gradient_that_is_not_finite_sends_nothing_and_keeps_the_error_feedback():
    codec = make_codec("sparseloco")
    codec.sparsify(torch.ones(VIEW.numel), VIEW, 2)
    before = residual(codec).clone()
    idx, values, flagged = codec.sparsify(torch.full((VIEW.numel,), float("nan")), VIEW, 2)
    assert flagged and idx.numel() == 0 and torch.equal(residual(codec), before)


def test_its_registration_costs_it_as_it_travels_and_brings_plain_averaging():
    entry = CODECS["sparseloco"]
    cost = entry.cost(CodecSettings().options)
    assert cost.density == 64 / 4096 and cost.entry_bytes == pytest.approx((12 + 1) / 8 + 4 / 64)
    assert entry.joinable and entry.sparse and make_codec("sparseloco").shared_state_dict()["flat"]["params"] == {}
    assert brought({"codec": "sparseloco", "local_steps": 8}, "resnet20", "sgd", CODECS)["outer_momentum"] == 0.0
    assert "outer_momentum" not in brought({"codec": "sparseloco"}, "resnet20", "sgd", CODECS)  # per step: no outer
    assert TrainConfig.from_dict({"codec": "sparseloco", "engine": "scalesgd"}).exchange.codec == "sparseloco"
    cfg = TrainConfig.from_dict({"codec": "sparseloco", "local_steps": 16})
    assert (cfg.periodic.outer_lr, cfg.periodic.outer_momentum) == (1.0, 0.0)
    given = TrainConfig.from_dict({"codec": "sparseloco", "local_steps": 16, "outer_momentum": 0.5})
    assert given.periodic.outer_momentum == 0.5  # what the user gives wins
    assert TrainConfig.from_dict({"codec": "fp8", "local_steps": 16}).periodic.outer_momentum == 0.9


def test_bad_options_are_refused_naming_them():
    with pytest.raises(UsageError, match="sparseloco_decay"):
        make_codec("sparseloco", CodecSettings(SparseLocoOptions(decay=1.5)))
    with pytest.raises(UsageError, match="sparseloco_top"):
        make_codec("sparseloco", CodecSettings(SparseLocoOptions(top=0)))
