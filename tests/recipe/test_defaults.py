"""A model and an optimizer bring their own recipe: where the user gives no value, the GPT sets its optimizer, batch
and length and AdamW a rate of Adam's order; given values win, config.json holds the resolved ones, and --help says
what each choice brings."""

import pytest

from scalesgd.cli import main
from scalesgd.config import TrainConfig
from scalesgd.models import MODELS
from scalesgd.optim import OPTIMIZERS
from scalesgd.recipe.defaults import brought


def test_the_readme_transformer_line_runs_adamw_at_adams_rate_with_the_gpts_own_length():
    cfg = TrainConfig.from_argv(["--workers", "2", "--model", "gpt", "--dataset", "text", "--accumulate", "4"])
    r = cfg.recipe
    assert (r.optimizer, r.base_lr, r.betas, r.weight_decay, r.schedule) == ("adamw", 1e-3, (0.9, 0.95), 0.1, "cosine")
    assert (r.batch_size, r.base_batch, r.epochs, r.warmup_epochs, cfg.data.samples) == (64, 64, 2, 0.125, 16384)
    assert r.peak_lr == pytest.approx(1e-3)  # not SGD's 0.1 scaled to 0.05


def test_adamw_on_an_image_model_brings_its_rate_and_the_square_root_rule():
    r = TrainConfig.from_argv(["--optimizer", "adamw", "--batch-size", "1024"]).recipe
    assert (r.base_lr, r.lr_scaling, r.schedule) == (1e-3, "sqrt", "cosine")
    assert r.peak_lr == pytest.approx(1e-3 * 2)  # √(1024 / 256)


def test_what_the_user_gives_wins_over_what_a_choice_brings():
    r = TrainConfig.from_argv(["--model", "gpt", "--dataset", "text", "--optimizer", "sgd", "--base-lr", "0.3",
                               "--betas", "0.9,0.99", "--epochs", "3"]).recipe
    assert (r.optimizer, r.base_lr, r.epochs, r.betas) == ("sgd", 0.3, 3, (0.9, 0.99))
    assert r.weight_decay == 1e-4  # sgd brings nothing: the option's own default
    assert brought({"model": "gpt", "optimizer": "sgd"}, "resnet8", "sgd") == {
        k: v for k, v in MODELS["gpt"].recipe.items() if k != "optimizer"}


def test_momentum_sgd_and_the_default_job_are_unchanged():
    r = TrainConfig.from_argv([]).recipe
    assert (r.optimizer, r.base_lr, r.weight_decay, r.schedule, r.lr_scaling, r.epochs) == (
        "sgd", 0.1, 1e-4, "step", "linear", 30)


def test_an_optimizer_other_than_the_models_own_is_named_apart_and_its_own_is_not():
    gpt = ["--model", "gpt", "--dataset", "text"]
    assert TrainConfig.from_argv([*gpt, "--optimizer", "muon"]).other_optimizer == "muon"
    assert TrainConfig.from_argv(gpt).other_optimizer == ""  # AdamW, the GPT's own
    assert TrainConfig.from_argv([*gpt, "--optimizer", "adamw"]).other_optimizer == ""  # its own, given
    assert TrainConfig.from_argv(["--optimizer", "lars"]).other_optimizer == "lars"  # the ResNet's own is SGD


def test_config_json_holds_the_resolved_values_and_a_stored_run_keeps_them():
    cfg = TrainConfig.from_argv(["--model", "gpt", "--dataset", "text"])
    stored = cfg.to_dict()
    assert (stored["optimizer"], stored["base_lr"], stored["betas"]) == ("adamw", 1e-3, [0.9, 0.95])
    old = {**stored, "base_lr": 0.05, "betas": [0.9, 0.999]}  # what an earlier version stored for the same command
    assert TrainConfig.from_dict(old).recipe.base_lr == 0.05 and TrainConfig.from_dict(old).recipe.betas == (
        0.9, 0.999)


def test_an_unknown_model_or_optimizer_is_left_to_validation_to_name():
    assert brought({"model": "nosuch", "optimizer": "nosuch"}, "resnet8", "sgd") == {}


def test_help_shows_what_each_model_and_optimizer_brings(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default 0.1; lamb: 0.032; adamw, onebit-adam, muon: 0.001)" in text
    assert "(default sgd; gpt: adamw)" in text and "(default 0.9,0.999; adamw, onebit-adam, muon: 0.9,0.95)" in text
    assert "(default resnet8; gpt brings --optimizer adamw, --batch-size 64, --base-batch 64, --samples 16384" in text
    assert all(name in OPTIMIZERS for name in ("adamw", "onebit-adam", "lamb", "muon"))
