"""`scalesgd train`'s configuration: one flag per field, checks that name fields, the schedule derived once."""

import json

import pytest

from scalesgd.cli import build_parser
from scalesgd.comm.codecs import CODECS, make_codec
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.options import flat_options


def train_parser():
    return build_parser()._subparsers._group_actions[0].choices["train"]


def test_every_field_has_a_flag_and_every_flag_a_field():
    flags = {a.dest: a.option_strings for a in train_parser()._actions if a.option_strings}
    flags.pop("help")
    assert flags.pop("resume") == ["--resume"]  # the command's own: which run to continue, not what it computes
    fields = {flat.name: [flat.flag] for flat in flat_options(TrainConfig)}
    assert flags == fields
    assert fields["fp8_headroom"] == ["--fp8-headroom"] and fields["density"] == ["--density"]  # as before families
    assert fields["topk_reuse"] == ["--topk-reuse"] and fields["momentum_correction"] == ["--momentum-correction"]


@pytest.mark.parametrize("changes,message", [
    ({"batch_size": 9}, "`batch_size` 9 does not divide evenly by `workers` 2; use a multiple of 2"),
    ({"model": "alexnet"}, "`model` 'alexnet' is not known; choose from resnet8, resnet20, resnet56, resnet50, vgg16"),
    ({"engine": "scalesgd", "codec": "powersgd"}, "`codec` 'powersgd' (with `engine` scalesgd) is not known"),
    ({"planner": "dlgs"}, "`planner` dlgs plans the groups of `codec` topk (with `engine` scalesgd); got `codec` fp32"),
    ({"fp8_quantile": 1.5}, "`fp8_quantile` 1.5: must be in (0, 1]"),
    ({"topk_reuse": 0}, "`topk_reuse` 0: must be >= 1"),
    ({"epochs": 3, "warmup_epochs": 5}, "`warmup_epochs` 5 is longer than training (`epochs` 3)"),
    ({"end_lr": 5.0}, "`end_lr` 5.0: must be >= 0 and below the scaled rate 0.05"),
    ({"dataset": "cifar10"}, "`dataset` cifar10 needs `data_dir`: the folder holding cifar-10-batches-py/"),
])
def test_bad_values_raise_errors_naming_fields_not_flags(changes, message):
    with pytest.raises(UsageError) as err:
        TrainConfig.from_dict(changes).validate()
    assert message in str(err.value) and "--" not in str(err.value)


def test_the_schedule_is_derived_in_one_place():
    cfg = TrainConfig.of(batch_size=512, base_batch=256, base_lr=0.1, epochs=90, warmup_epochs=5).validate()
    peak, factor = cfg.recipe.lr_schedule(steps_per_epoch=10)
    assert peak == pytest.approx(0.2) == cfg.recipe.peak_lr
    assert factor.milestones == (30, 60, 80) and factor.warmup_steps == 50 and factor.total_steps == 900
    assert factor.start == pytest.approx(0.5) and factor.arccot_epoch == 45
    assert factor(0) == pytest.approx(0.5) and factor(50) == 1.0 and factor(300) == pytest.approx(0.1)


def test_what_the_options_imply_comes_from_the_registries():
    assert TrainConfig.of(engine="scalesgd", algorithm="hierarchical").exchange.needs_topology
    assert not TrainConfig.of(algorithm="hierarchical").exchange.needs_topology  # DDP does its own allreduce
    assert TrainConfig.of(codec="fp8").exchange.needs_topology
    assert not TrainConfig.of(codec="fp8-flat").exchange.needs_topology
    assert TrainConfig.of(codec="fp8").exchange.own_group  # our hook under DDP
    assert not TrainConfig.of(codec="fp16").exchange.own_group  # PyTorch's hook, in DDP's group
    assert TrainConfig.of(engine="scalesgd").exchange.own_group
    setup = TrainConfig.from_dict({"codec": "fp8", "fp8_period": 7, "seed": 3}).exchange_setup()
    assert setup.codec == "fp8" and setup.settings.options["fp8"].period == 7 and setup.settings.seed == 3
    assert set(CODECS) >= {"fp32", "fp16", "bf16", "powersgd", "fp8", "topk"}


def test_config_json_round_trips_and_runtime_options_may_change_on_resume():
    cfg = TrainConfig.of(milestones=(1.0, 2.0), epochs=3, warmup_epochs=1).validate()
    again = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert TrainConfig.of(quiet=True, timeout=9, threads=1, trace="t.json").incompatible_with(TrainConfig()) == []
    assert TrainConfig.of(batch_size=64, seed=1).incompatible_with(TrainConfig()) == ["batch_size", "seed"]
    with pytest.raises(UsageError, match="unknown configuration keys"):
        TrainConfig.from_dict({"batch": 1})


def test_from_argv_is_what_the_command_would_run():
    cfg = TrainConfig.from_argv(["--batch-size", "64", "--no-zero-gamma", "--milestones", "10,20"])
    assert (cfg.recipe.batch_size, cfg.recipe.zero_gamma, cfg.recipe.milestones) == (64, False, (10.0, 20.0))
    with pytest.raises(UsageError, match="scalesgd train: unrecognized arguments: --resume"):
        TrainConfig.from_argv(["--resume", "x"])


def test_compression_starts_at_the_end_of_warmup_unless_told():
    assert TrainConfig.of(warmup_epochs=2.5).compress_after_steps(10) == 25
    assert TrainConfig.of(warmup="none").compress_after_steps(10) == 0
    assert TrainConfig.of(compress_after="40").compress_after_steps(10) == 40
    assert TrainConfig.of(compress_after="1.5ep").compress_after_steps(10) == 15
    settings = TrainConfig.from_dict(dict(engine="scalesgd", codec="topk", momentum_correction=True, density_warmup=3,
                                          local_clip=2.0, nesterov=True)).validate().codec_settings(steps_per_epoch=7)
    dgc = make_codec("topk", settings).dgc
    assert dgc.momentum == 0.9 and dgc.nesterov and dgc.warmup_epochs == 3
    assert dgc.steps_per_epoch == 7 and dgc.clip == 2.0
    setup = TrainConfig.of(engine="scalesgd", codec="topk", warmup_epochs=5).exchange_setup(steps_per_epoch=7)
    assert setup.compress_after == 35
    assert make_codec("topk", TrainConfig.of(engine="scalesgd", codec="topk").codec_settings()).dgc.momentum == 0.0


def test_the_options_live_in_namespaces_under_their_flat_names():
    cfg = TrainConfig.from_argv(["--model", "gpt", "--dataset", "text", "--gpt-block", "32", "--exchange", "auto",
                                 "--fp8-headroom", "64", "--workers", "1", "--quiet", "--batch-size", "8"])
    assert (cfg.model.name, cfg.model.options["gpt"].block, cfg.data.dataset) == ("gpt", 32, "text")
    assert (cfg.exchange.mode, cfg.exchange.codec_options["fp8"].headroom) == ("auto", 64.0)
    assert (cfg.runtime.workers, cfg.output.quiet, cfg.recipe.batch_size) == (1, True, 8)
    flat = cfg.to_dict()  # config.json: the flat names a run directory of any version holds
    assert (flat["model"], flat["gpt_block"], flat["exchange"], flat["fp8_headroom"]) == ("gpt", 32, "auto", 64.0)
    assert TrainConfig.from_dict(flat) == cfg


def test_a_run_directory_written_before_the_namespaces_resumes(tmp_path):
    """config.json as the flat config of 0.1.0 wrote it: every key read back into its namespace."""
    old = {"workers": 2, "dataset": "digits", "model": "resnet8", "gpt_block": 64, "batch_size": 256, "epochs": 30,
           "base_lr": 0.1, "engine": "scalesgd", "codec": "topk", "density": 0.01, "exchange": "manual",
           "auto_codecs": ["fp32", "fp16"], "betas": [0.9, 0.999], "milestones": None, "run_dir": "runs/x"}
    cfg = TrainConfig.from_dict(old)
    assert (cfg.exchange.codec, cfg.exchange.codec_options["topk"].density, cfg.output.run_dir) == \
        ("topk", 0.01, "runs/x")
    assert cfg.exchange.auto_codecs == ("fp32", "fp16") and cfg.recipe.betas == (0.9, 0.999)


def test_help_groups_follow_the_namespaces():
    from scalesgd.options import flat_options
    groups = {flat.name: flat.group for flat in flat_options(TrainConfig)}
    assert (groups["dataset"], groups["model"], groups["gpt_block"], groups["batch_size"]) == \
        ("data", "model", "model options: gpt", "recipe")
    assert (groups["codec"], groups["fp8_headroom"], groups["workers"], groups["run_dir"]) == \
        ("exchange", "codec options: fp8", "runtime", "output")
