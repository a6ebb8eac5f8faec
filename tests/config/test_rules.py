"""The rules between options: `--exchange auto` weighs only what manual mode would run, and says what it left out;
a variance frozen before Adam's averaging horizon, emulated bf16 and Muon's bf16 on a scalar path are warned of at
start."""

import re

import pytest

from scalesgd.config import TrainConfig, rules
from scalesgd.errors import UsageError, as_flags
from tests.command import scalesgd


def test_auto_drops_the_exchanges_that_cannot_carry_the_momentum_the_optimizer_leaves_to_them():
    cfg = TrainConfig.from_argv(["--exchange", "auto", "--auto-codecs", "topk,fp8", "--optimizer", "adamw",
                                 "--momentum-correction"])
    fitting, dropped = rules.auto_fitting(cfg)
    assert fitting == ("topk",) and list(dropped) == ["fp8"]
    assert as_flags(rules.advice(cfg)[0]) == ("--exchange auto leaves out fp8: the optimizer leaves its momentum to "
                                              "the exchange (--momentum-correction), which fp8 does not carry")


def test_auto_keeps_a_codec_whose_family_option_is_given_and_the_others_beside_it():
    cfg = TrainConfig.from_argv(["--exchange", "auto", "--auto-codecs", "topk,fp8,ddp", "--density", "0.05"])
    assert rules.auto_fitting(cfg) == (("topk", "fp8", "ddp"), {})
    assert rules.advice(cfg) == []


def test_a_freeze_given_before_adams_horizon_warns_and_the_default_waits_for_it():
    given = ["--engine", "scalesgd", "--codec", "onebit", "--optimizer", "onebit-adam", "--betas", "0.9,0.99"]
    early = TrainConfig.from_argv([*given, "--compress-after", "20"])
    assert early.compress_after_steps(10) == 20
    assert "before its averaging horizon 1/(1 − β2) = 100 steps" in rules.advice(early)[0]
    default = TrainConfig.from_argv(given)  # warmup: 5 epochs of 10 steps, then no earlier than 100
    assert default.compress_after_steps(10) == 100 and rules.advice(default) == []
    assert default.compress_after_steps(40) == 200  # a warmup longer than the horizon is kept


def test_the_horizon_applies_to_every_variance_freeze_and_to_nothing_else():
    frozen = [["--optimizer", "adamw", "--freeze-variance", "--engine", "scalesgd", "--codec", "topk"],
              ["--optimizer", "adamw", "--momentum-correction", "--engine", "scalesgd", "--codec", "topk"]]
    for given in frozen:
        assert TrainConfig.from_argv([*given, "--betas", "0.9,0.999"]).compress_after_steps(10) == 1000
    plain = TrainConfig.from_argv(["--optimizer", "adamw", "--engine", "scalesgd", "--codec", "fp8"])
    assert plain.compress_after_steps(10) == 50


@pytest.mark.parametrize("native,warned", [(False, True), (True, False)])
def test_bf16_on_a_cpu_without_native_bf16_warns_with_the_measured_slowdown(monkeypatch, native, warned):
    monkeypatch.setattr(rules, "native_bf16", lambda: native)
    monkeypatch.setattr(rules.torch.cuda, "is_available", lambda: False)  # on a GPU bf16 runs there
    lines = rules.advice(TrainConfig.from_argv(["--precision", "bf16"]))
    assert any("measured 10.3× slower a step than fp32" in line for line in lines) == warned


@pytest.mark.parametrize("onednn,cuda,warned", [(False, False, True), (True, False, False), (False, True, False)])
def test_muon_on_a_cpu_whose_onednn_has_no_bf16_warns_with_the_measured_slowdown(monkeypatch, onednn, cuda, warned):
    monkeypatch.setattr(rules, "onednn_bf16", lambda: onednn)
    monkeypatch.setattr(rules.torch.cuda, "is_available", lambda: cuda)
    lines = rules.advice(TrainConfig.from_argv(["--model", "gpt", "--dataset", "text", "--optimizer", "muon"]))
    assert any("torch's Muon orthogonalises in bf16" in line and "measured 10.2× fewer tokens a second than adamw" in line
               for line in lines) == warned
    assert not any("Muon" in line for line in rules.advice(TrainConfig.from_argv(["--model", "gpt", "--dataset",
                                                                                  "text"])))
    assert not any("Muon" in line for line in rules.advice(TrainConfig.from_argv(["--optimizer", "muon"])))  # a CNN


def test_periodic_synchronisation_refuses_what_needs_an_exchange_every_step_and_its_bad_schedules():
    cases = {("--local-steps", "8", "--exchange", "auto"): "`exchange` auto chooses how the run exchanges, periodic "
                                                           "synchronisation among its choices",
             ("--local-steps", "8", "--codec", "powersgd"): "`codec` 'powersgd' (with `local_steps`",
             ("--local-steps", "8", "--momentum-correction", "--codec", "topk"): "`momentum_correction` True needs",
             ("--local-steps", "8", "--fragments", "3"): "`fragments` 3: give a divisor of `local_steps` 8",
             ("--local-steps", "64", "--fragments", "32"): "`fragments` 32: the model has 19 layers with parameters; "
                                                           "give 1 to 19 dividing `local_steps` 64 (resnet8)",
             ("--local-steps", "8", "--algorithm", "halving_doubling"): "`algorithm` halving_doubling shapes a "
                                                                        "per-step exchange",
             ("--local-steps", "8", "--codec", "fp8", "--topk-wire", "plain"): "`topk_wire` applies to the topk "
                                                                              "codecs",
             ("--local-steps", "8", "--replica", "node", "--workers", "4"): "the 4 workers are one node",
             ("--replica", "node",): "`replica` node applies to periodic synchronisation",
             ("--engine", "scalesgd-fsdp", "--shard", "node"): "`shard` node shards within each node and sums across "
                                                               "nodes, "
                                                      "and the 2 workers are one node",
             ("--local-steps", "8", "--fragments", "2", "--overlap-steps", "4"): "`overlap_steps` 4: give 0 to 3",
             ("--local-steps", "8", "--codec", "onebit"): "give `onebit_beta1` 0",
             ("--local-steps", "8", "--compress-after", "5"): "`compress_after` 5 needs the gradients exchanged",
             ("--local-steps", "8", "--peer", "torchft", "--codec", "fp8"): "`peer` torchft sends fp32",
             ("--local-steps", "8", "--peer-bucket-mb", "25"): "`peer_bucket_mb` 25 sizes torchft's buckets: add "
                                                               "`peer` torchft",
             ("--mix", "0.5",): "`mix` 0.5 applies to periodic synchronisation",
             ("--carry",): "`carry` applies to periodic synchronisation",
             ("--local-steps", "8", "--carry"): "`carry` keeps the inner steps taken while a round's exchange is in "
                                                "flight: add `overlap_steps`",
             ("--local-steps", "8", "--overlap-steps", "2", "--carry", "--mix", "0.5"): "`carry` with `mix` 0.5",
             ("--local-steps", "8", "--overlap-steps", "2", "--carry", "--peer", "torchft"): "`carry` is our DiLoCo's"}
    for argv, words in cases.items():
        with pytest.raises(UsageError, match=re.escape(words)):
            TrainConfig.from_argv(list(argv))
    assert TrainConfig.from_argv(["--local-steps", "8", "--codec", "onebit", "--onebit-beta1", "0"]).periodic.on


def test_a_sparse_pseudo_gradient_under_adamw_gets_no_warning_of_gradient_spikes():
    per_step = TrainConfig.from_argv(["--model", "gpt", "--dataset", "text", "--engine", "scalesgd", "--codec", "topk"])
    periodic = TrainConfig.from_argv(["--model", "gpt", "--dataset", "text", "--local-steps", "8", "--codec", "topk"])
    assert any("rare spikes" in line and "`momentum_correction`" in line for line in rules.advice(per_step))
    assert not any("rare spikes" in line for line in rules.advice(periodic))
    sparseloco = TrainConfig.from_argv(["--model", "gpt", "--dataset", "text", "--engine", "scalesgd", "--codec",
                                        "sparseloco"])  # its family has no momentum correction: the advice says so
    [line] = [line for line in rules.advice(sparseloco) if "rare spikes" in line]
    assert "`local_steps`" in line and "momentum_correction" not in line


@pytest.mark.parametrize("argv,words", [
    (("--engine", "scalesgd", "--codec", "topk", "--momentum-correction"),
     ("--momentum-correction moves the optimizer's momentum into the exchange, and muon orthogonalises each weight "
      "matrix's own momentum before it steps: it needs --optimizer sgd")),
    (("--engine", "scalesgd", "--codec", "onebit"),
     ("--optimizer onebit-adam and --codec onebit go together (the codec sends Adam's momentum, the optimizer steps "
      "with it); got --optimizer muon")),
    (("--engine", "scalesgd", "--codec", "topk", "--freeze-variance", "--compress-after", "5"),
     "--freeze-variance freezes AdamW's variance where compression starts: it needs --optimizer adamw"),
    (("--engine", "scalesgd-fsdp"), ("--optimizer muon orthogonalises each whole weight matrix, and --engine "
                                     "scalesgd-fsdp steps shards of them: give --engine scalesgd or ddp")),
    (("--nesterov",), "--nesterov is momentum SGD's (sgd, lars); muon's matrices take torch Muon's Nesterov"),
], ids=["momentum-correction", "onebit", "freeze-variance", "sharded", "nesterov"])
def test_muon_with_an_exchange_that_carries_its_momentum_or_shards_its_matrices_is_one_line_and_exit_2(tmp_path, argv,
                                                                                                      words):
    proc = scalesgd("train", "--optimizer", "muon", *argv, "--run-dir", "run", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("scalesgd: error: ") and words in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
