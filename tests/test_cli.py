"""Bad input: one clear line, exit status 2, no traceback, nothing written over."""

import argparse
import re
import subprocess
import sys

import pytest

from scalesgd.cli import build_parser, main


def run_cli(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


BAD = [
    (("--batch-size", "9", "--workers", "2"), "--batch-size 9 does not divide evenly by --workers 2"),
    (("--model", "alexnet"), "choose from resnet8, resnet20, resnet56, resnet50, vgg16"),
    (("--dataset", "imagenet"), "choose from digits, synthetic, cifar10"),
    (("--schedule", "linear"), "choose from step, cosine, poly, arccot"),
    (("--optimizer", "adam"), "--optimizer 'adam' is not known; choose from sgd, lars"),
    (("--trust-coefficient", "0"), "--trust-coefficient 0.0: must be a positive number"),
    (("--arccot-slope", "-1"), "--arccot-slope -1.0: must be a positive number"),
    (("--arccot-epoch", "40"), "--arccot-epoch 40.0: must be in 0..30 (--epochs)"),
    (("--end-lr", "5"), "--end-lr 5.0: must be >= 0 and below the scaled rate 0.05"),
    (("--gamma", "2"), "--gamma 2.0: must be in (0, 1]"),
    (("--bn-momentum", "0"), "--bn-momentum 0.0: must be in (0, 1]"),
    (("--bn-batch", "48"), "--bn-batch 48: must divide the 64 samples per worker"),
    (("--momentum", "0", "--nesterov"), "--nesterov needs --momentum above 0"),
    (("--warmup", "slow"), "choose from gradual, constant, none"),
    (("--lr-scaling", "cube"), "choose from linear, sqrt, none"),
    (("--epochs", "0"), "--epochs 0: must be a positive number"),
    (("--epochs", "-3"), "--epochs -3: must be a positive number"),
    (("--base-lr", "0"), "--base-lr 0.0: must be a positive number"),
    (("--base-lr", "nan"), "--base-lr nan: must be a positive number"),
    (("--batch-size", "0"), "--batch-size 0: must be a positive number"),
    (("--workers", "0"), "--workers 0: must be a positive number"),
    (("--epochs", "3", "--warmup-epochs", "5"), "--warmup-epochs 5.0 is longer than training"),
    (("--dataset", "cifar10"), "--dataset cifar10 needs --data-dir"),
    (("--batch-size", "4096"), "larger than the digits training set (1437 samples)"),
    (("--milestones", "20,10"), "must be increasing epochs"),
    (("--milestones", "a,b"), "is not a comma-separated list of epochs"),
    (("--workers", "two"), "invalid int value: 'two'"),
    (("--label-smoothing", "1.5"), "--label-smoothing 1.5: must be in [0, 1)"),
    (("--momentum", "1"), "--momentum 1.0: must be in [0, 1)"),
    (("--frobnicate",), "unrecognized arguments: --frobnicate"),
    (("--engine", "horovod"), "--engine 'horovod' is not known; choose from ddp, scalesgd"),
    (("--engine", "scalesgd", "--codec", "powersgd"), "choose from fp32, fp16, bf16"),
    (("--codec", "fp7"), "choose from fp32, fp16, bf16, powersgd"),
    (("--algorithm", "tree"), "choose from ring, halving_doubling, hierarchical, native"),
    (("--buckets", "size:0"), "use one of size:MB, growing[:FIRST_MB[:FACTOR]], layer, single"),
    (("--procs-per-node", "3"), "--procs-per-node 3 does not divide --workers 2"),
    (("--compress-after", "soon"), "--compress-after soon: give STEPS, EPOCHSep (e.g. 2ep) or warmup"),
    (("--compress-after", "-5"), "--compress-after -5: must be >= 0"),
    (("--fp8-headroom", "0.5"), "--fp8-headroom 0.5: must be >= 1"),
    (("--fp8-saturation-limit", "1"), "--fp8-saturation-limit 1.0: must be in [0, 1)"),
    (("--fp8-saturation-window", "0"), "--fp8-saturation-window 0: must be >= 1 (steps)"),
    (("--density-warmup", "-1"), "--density-warmup -1: must be >= 0"),
    (("--codec", "lowrank", "--rank", "0"), "--rank 0: must be in [1, 65536]"),
    (("--codec", "lowrank", "--factor-wire", "fp9"), "--factor-wire 'fp9' is not known; choose from fp32, fp16, bf16"),
    (("--codec", "fp16", "--factor-wire", "bf16"), "--factor-wire applies to the lowrank codecs (lowrank, "
                                                    "lowrank-acp); got --codec fp16"),
    (("--local-clip", "-1"), "--local-clip -1.0: must be a finite number >= 0"),
    (("--noise-scale", "--workers", "1"), "--noise-scale compares each worker's gradient with the mean over "
                                          "workers: it needs --workers 2 or more, got 1"),
    (("--codec", "fp8", "--momentum-correction"), "--momentum-correction applies to the topk codecs (topk, "
                                                  "topk-global, topk-nodes, lags); got --codec fp8"),
    (("--engine", "scalesgd", "--codec", "topk", "--density-warmup", "2", "--codec", "fp16"),
     "--density-warmup applies to the topk codecs"),
    (("--engine", "scalesgd", "--codec", "topk", "--momentum-correction", "--optimizer", "lars"),
     "--momentum-correction moves the optimizer's momentum into the exchange: it needs --optimizer sgd with "
     "--momentum above 0, or adamw with dense steps first"),
    (("--engine", "scalesgd", "--codec", "topk", "--momentum-correction", "--momentum", "0"),
     "got sgd with momentum 0.0"),
    (("--engine", "scalesgd", "--codec", "topk", "--momentum-correction", "--optimizer", "adamw", "--compress-after",
      "0"), "or adamw with dense steps first (--compress-after, where its variance is frozen); got adamw"),
]


@pytest.mark.parametrize("argv,expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_option_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, monkeypatch, argv, expected):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(capsys, "train", "--run-dir", str(tmp_path / "run"), *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("scalesgd: error: ")
    assert expected in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_missing_and_malformed_data_dir(capsys, tmp_path):
    code, err = run_cli(capsys, "train", "--dataset", "cifar10", "--data-dir", str(tmp_path / "nowhere"))
    assert code == 2 and "nowhere" in err and err.count("\n") == 1
    (tmp_path / "cifar-10-batches-py").mkdir()
    code, err = run_cli(capsys, "train", "--dataset", "cifar10", "--data-dir", str(tmp_path))
    assert code == 2 and "data_batch_1" in err and err.count("\n") == 1


def test_existing_run_dir_is_not_written_over(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    code, err = run_cli(capsys, "train", "--run-dir", str(run))
    assert code == 2 and "already holds files but no checkpoint" in err and "nothing to resume" in err
    assert (run / "config.json").read_text() == "{}"
    assert [p.name for p in run.iterdir()] == ["config.json"]
    (run / "checkpoint.pt").write_bytes(b"")
    code, err = run_cli(capsys, "train", "--run-dir", str(run))
    assert code == 2 and "already holds a run" in err and f"--resume {run}" in err


def test_resume_without_checkpoint(capsys, tmp_path):
    code, err = run_cli(capsys, "train", "--resume", str(tmp_path))
    assert code == 2 and "no checkpoint at" in err


def test_resume_of_a_garbage_checkpoint_is_one_line(capsys, tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    code, err = run_cli(capsys, "train", "--resume", str(tmp_path))
    assert code == 2 and "not a readable scalesgd checkpoint" in err and err.count("\n") == 1
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"not a checkpoint"


def test_real_process_exit_status_and_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scalesgd", "train", "--model", "lenet"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "--model 'lenet' is not known" in proc.stderr


def test_help_lists_the_train_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--workers", "--lr-scaling", "--warmup", "--resume", "--no-zero-gamma"):
        assert option in out


def described(text: str | None) -> bool:
    """Whether a help says what the option does, beyond its accepted names and its default."""
    text = re.sub(r"\s*\(default .*\)$", "", (text or "").strip())
    text = re.sub(r"^\s*[^\s|]*(\s*\|\s*[^\s|]*)+(:\s|$)", "", text)  # `a | b | c: ` as help_of puts it
    return re.search(r"[^\W\d_]{2}", text) is not None


def undescribed(parser: argparse.ArgumentParser, path: str, seen: list[str]) -> list[str]:
    """Every action of `parser` and of its subparsers, at any depth, without a description."""
    seen.append(path)
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            missing += [f"{path} {a.dest}" for a in action._choices_actions if not described(a.help)]
            for name, sub in action.choices.items():
                missing += undescribed(sub, f"{path} {name}", seen)
            continue
        if not described(action.help):
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}: {action.help!r}")
    return missing


def test_every_option_of_every_command_says_what_it_does():
    seen: list[str] = []
    assert undescribed(build_parser(), "scalesgd", seen) == []
    assert {"scalesgd train", "scalesgd bench link", "scalesgd sweep", "scalesgd simulate",
            "scalesgd testbed run"} <= set(seen)  # the walk reached bench kinds and testbed verbs
    assert not described("(default 30)") and not described("a | b (default a)") and not described("")
    assert described("a | b: what it picks (default a)") and described("passes over the data")


def test_plan_prints_the_bucket_table(capsys):
    assert main(["plan", "--model", "resnet20", "--buckets", "growing", "--classes", "10"]) == 0
    out = capsys.readouterr().out
    assert "bucket plan growing" in out and "fc.bias" in out and "conv1.weight" in out


def test_plan_rejects_a_bad_spec_in_one_line(capsys):
    code, err = run_cli(capsys, "plan", "--buckets", "growing:1:0.5")
    assert code == 2 and err.count("\n") == 1 and "FACTOR >= 1" in err
