"""Bad input is refused before any worker starts: one `scalesgd: error:` line naming the value and what is accepted,
exit status 2, no traceback, nothing written. Every number option either validates finite or is a UsageError."""

import math
import os
import socket
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalesgd import checks
from scalesgd.bench.allreduce import AllreduceBenchConfig
from scalesgd.bench.train import TrainBenchConfig
from scalesgd.cli import main
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.options import build, flat_options, flatten
from scalesgd.train.sweep import SweepConfig
from tests.command import scalesgd as run_command

CONFIGS = {"train": TrainConfig, "bench allreduce": AllreduceBenchConfig, "bench train": TrainBenchConfig,
           "sweep": SweepConfig}
SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-300, 5e-324, 0.0, -0.0, -3.0, 2.0**64)
SPECIAL_INTS = (0, -1, -3, 1, 2, 2**31, 2**32, 2**63 - 1, 2**63, 10**30, -10**30)
FLOATS = st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats())
INTS = st.one_of(st.sampled_from(SPECIAL_INTS), st.integers())


@pytest.fixture(autouse=True)
def local_launch(monkeypatch):
    """The checks a local launch makes (not under torchrun): the strictest."""
    for name in checks.LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def number_options(cls) -> dict[str, tuple[bool, bool]]:
    """Each number option of a config: (a list of them?, floats?)."""
    found = {}
    for flat in flat_options(cls):  # a codec family's options too (fp8_headroom, density, …)
        kind = str(flat.field.type)
        if ("int" in kind or "float" in kind) and "bool" not in kind and "str" not in kind:
            found[flat.name] = ("tuple" in kind, "float" in kind)
    return found


def values_for(is_list: bool, is_float: bool):
    one = FLOATS if is_float else INTS
    return st.lists(one, max_size=3).map(tuple) if is_list else one


def accepted_or_refused(cls, changes: dict) -> None:
    """Validating either raises UsageError (nothing else) or leaves every number option finite."""
    try:
        cfg = build(cls, changes).validate()
    except UsageError:
        return
    values = flatten(cfg)
    for name in number_options(cls):
        value = values[name]
        for one in value if isinstance(value, tuple) else () if value is None else (value,):
            assert math.isfinite(one) if isinstance(one, float) else abs(one) < 2**63, (name, value)


def test_every_config_has_number_options_to_draw():
    assert {"timeout", "warmup_epochs", "milestones", "seed", "workers", "fp8_headroom", "density"} <= set(
        number_options(TrainConfig))
    assert {"sizes", "timeout", "threads"} <= set(number_options(AllreduceBenchConfig))
    assert set(number_options(SweepConfig)) == {"batches", "seeds", "base_lrs"}


@pytest.mark.parametrize("command,name", [(command, name) for command, cls in CONFIGS.items()
                                          for name in number_options(cls)])
def test_each_number_option_takes_every_extreme_or_refuses_it(command, name):
    cls = CONFIGS[command]
    is_list, is_float = number_options(cls)[name]
    for value in SPECIAL_FLOATS if is_float else SPECIAL_INTS:
        accepted_or_refused(cls, {name: (value,) if is_list else value})


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # env cleared once
@given(st.data())
def test_any_numbers_validate_finite_or_raise_a_usage_error(data):
    command = data.draw(st.sampled_from(sorted(CONFIGS)), label="command")
    kinds = number_options(CONFIGS[command])
    names = data.draw(st.lists(st.sampled_from(sorted(kinds)), min_size=1, max_size=3, unique=True), label="options")
    accepted_or_refused(CONFIGS[command], {name: data.draw(values_for(*kinds[name]), label=name) for name in names})


# ---- the command line, as a user runs it ----------------------------------------------------------------

def scalesgd_process(*argv, cwd):
    """The command in a process of its own, as a shell runs it (the other tests run it in this one)."""
    return subprocess.run([sys.executable, "-m", "scalesgd", *argv], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def scalesgd(*argv, cwd, env=None):
    return run_command(*argv, cwd=cwd, env=None if env is None else {**os.environ, **env}, timeout=120)


@pytest.fixture
def busy_port():
    """A port something listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield str(listener.getsockname()[1])


TRAIN = ("train", "--run-dir", "run")
REFUSED = [
    ((*TRAIN[:1], "--run-dir", "f"), "--run-dir f: exists and is not a directory"),
    ((*TRAIN[:1], "--run-dir", "f/sub"), "--run-dir f/sub: f exists and is not a directory"),
    (("bench", "allreduce", "--out", "f"), "--out f: exists and is not a directory"),
    (("bench", "codec", "--out", "f/x"), "--out f/x: f exists and is not a directory"),
    (("sweep", "--out", "f"), "--out f: exists and is not a directory"),
    (("simulate", "--model", "resnet20", "--iteration-time", "1", "--out", "f"), "--out f: exists and is not a dir"),
    ((*TRAIN, "--seed", str(10**30)), f"--seed {10**30}: must be in [0, 4294967295] (numpy's seed range)"),
    ((*TRAIN, "--seed", "-1"), "--seed -1: must be in [0, 4294967295]"),
    (("sweep", "--seeds", "0,4294967296"), "--seeds 0,4294967296: 4294967296 must be in [0, 4294967295]"),
    ((*TRAIN, "--timeout", "1e300"), "--timeout 1e+300: must be in (0, 604800] (seconds, at most 7 days)"),
    ((*TRAIN, "--timeout", "nan"), "--timeout nan: must be in (0, 604800]"),
    (("bench", "allreduce", "--timeout", "inf"), "--timeout inf: must be in (0, 604800]"),
    ((*TRAIN, "--warmup", "none", "--warmup-epochs", "nan"), "--warmup-epochs nan: must be a finite number >= 0"),
    ((*TRAIN, "--warmup", "none", "--warmup-epochs", "-3"), "--warmup-epochs -3.0: must be a finite number >= 0"),
    ((*TRAIN, "--end-lr=-inf"), "--end-lr -inf: must be a finite number"),
    ((*TRAIN, "--fp8-headroom", "inf"), "--fp8-headroom inf: must be a finite number"),
    ((*TRAIN, "--compress-after", "1e400ep"), "--compress-after 1e400ep: must be >= 0 and finite"),
    (("bench", "fp8-range", "--headrooms", "1,inf"), "--headrooms 1.0,inf: must be a finite number"),
    ((*TRAIN, "--master-addr", "999.1.1.1"), "--master-addr 999.1.1.1: must be an IP address"),
    (("bench", "allreduce", "--master-addr", "999.1.1.1"), "--master-addr 999.1.1.1: must be an IP address"),
    ((*TRAIN, "--master-addr", "192.0.2.1"), "--master-addr 192.0.2.1: is not an address of this machine"),
    ((*TRAIN, "--dataset", "synthetic", "--samples", "1000000000000"),
     "--samples 1000000000000: the synthetic data of 32×32 images in each of 2 worker(s): "),
    ((*TRAIN, "--threads", "100000"), "--threads 100000: must be in [0, "),
    (("bench", "allreduce", "--threads", "100000"), "cores; more threads only take turns on them"),
    (("bench", "allreduce", "--sizes", "100G"), "--sizes 107374182400: 3 buffers of 107,374,182,400 float32"),
    (("bench", "allreduce", "--sizes", "infK"), "is not a list of element counts"),
    (("bench", "allreduce", "--workers", "10000", "--sizes", "1K"), "--workers 10000: must be at most "),
    ((*TRAIN, "--workers", "10000"), "--workers 10000: must be at most "),
    (("plan", "--classes", "-1"), "--classes -1: must be a positive number"),
    (("plan", "--classes", "0"), "--classes 0: must be a positive number"),
    (("plan", "--in-channels", "0"), "--in-channels 0: must be a positive number"),
    ((*TRAIN, "--trace", "nodir/t.json"), "--trace nodir/t.json: its folder nodir does not exist"),
    ((*TRAIN, "--model", "gpt"), "--model gpt does not read the image of --dataset digits; use resnet8, resnet20"),
    ((*TRAIN, "--dataset", "text"), "--model resnet8 does not read the text of --dataset text; use gpt"),
    ((*TRAIN, "--dataset", "text", "--model", "gpt", "--data-file", "f"), "--data-file f: "),
    ((*TRAIN, "--dataset", "text", "--model", "gpt", "--data-file", "nofile"), "--data-file nofile: "),
    ((*TRAIN, "--data-file", "f"), "--data-file is a text to train a language model on: it needs --dataset text"),
    ((*TRAIN, "--dataset", "text", "--model", "gpt", "--gpt-width", "130"), "--gpt-width 130: "),
    ((*TRAIN, "--accumulate", "3"), "--batch-size 128 does not divide evenly by --workers 2 × --accumulate 3"),
    ((*TRAIN, "--accumulate", "0"), "--accumulate 0: must be >= 1"),
    ((*TRAIN, "--optimizer", "onebit-adam"), "--optimizer onebit-adam and --codec onebit go together"),
    ((*TRAIN, "--codec", "onebit", "--optimizer", "onebit-adam", "--betas", "0.8,0.99"),
     "--onebit-beta1 0.9 must equal the optimizer's β1"),
    ((*TRAIN, "--codec", "onebit", "--optimizer", "onebit-adam", "--compress-after", "0"),
     "--compress-after 0 leaves --codec onebit no dense warm-up"),
    ((*TRAIN, "--betas", "0.9,1"), "--betas 0.9,1.0: give two decay rates"),
    ((*TRAIN, "--betas", "a,b"), "--betas: 'a,b' is not a comma-separated list of decay rates β1,β2, each in [0, 1)"),
    ((*TRAIN, "--accumulate", "1000000000"), "--accumulate 1000000000 is more micro-batches than the 64 sample(s) "
                                             "each worker has a step (--batch-size 128 over --workers 2); use 1..64"),
    # --exchange auto once ran what manual mode refuses, exit 0: 1-bit Adam without its codec, momentum correction
    # with no exchange carrying the momentum, and an explicit --codec dropped without a word
    ((*TRAIN, "--exchange", "auto", "--engine", "scalesgd", "--codec", "onebit", "--optimizer", "onebit-adam",
      "--compress-after", "2"), "--codec onebit with --exchange auto: auto chooses the codec and buckets among "),
    ((*TRAIN, "--exchange", "auto", "--codec", "topk", "--momentum-correction"),
     "--codec topk with --exchange auto: auto chooses the codec and buckets among --auto-codecs (e.g. --auto-codecs "
     "topk,fp8); drop --codec, or drop --exchange auto to run it as given"),
    ((*TRAIN, "--exchange", "auto", "--optimizer", "onebit-adam"),
     "no exchange in --auto-codecs (fp32, fp16, bf16, fp8, ddp, ddp-fp16) fits this run as manual mode would run it; "
     "fp32: --optimizer onebit-adam and --codec onebit go together"),
    ((*TRAIN, "--exchange", "auto", "--optimizer", "adamw", "--momentum-correction"),
     "--momentum-correction applies to the topk codecs, and --auto-codecs lists none of them"),
    ((*TRAIN, "--freeze-variance"), "--freeze-variance freezes AdamW's variance where compression starts"),
    *([((*TRAIN, "--engine", "ddp", "--codec", "bf16"), "--codec bf16 with --engine ddp is PyTorch's own hook, "
                                                        "which runs only on CUDA with NCCL (this machine has no GPU)")]
      if not torch.cuda.is_available() else []),
    ((*TRAIN, "--precision", "fp8"), "--precision 'fp8' is not known; choose from fp32, bf16, fp16"),
    ((*TRAIN, "--engine", "scalesgd-fsdp", "--codec", "powersgd"),
     "--codec powersgd is PyTorch's own DDP hook (--engine ddp)"),
    ((*TRAIN, "--engine", "scalesgd-fsdp", "--shard", "node", "--procs-per-node", "1", "--codec", "lags"),
     "--codec lags groups whole gradients its own way (its buckets: layer), and --engine scalesgd-fsdp sums each "),
    ((*TRAIN, "--engine", "scalesgd-fsdp", "--precision", "fp16"),
     "--precision fp16 with --engine scalesgd-fsdp: a loss scaler over "),
    ((*TRAIN, "--engine", "scalesgd-fsdp", "--local-steps", "4"),
     "--local-steps 4 with --engine scalesgd-fsdp: periodic "),
    ((*TRAIN, "--engine", "fsdp2", "--exchange", "auto"), "--exchange auto chooses the codec on our sharded engine's "
     "sums; --engine fsdp2 is FSDP2 as it comes: give --engine scalesgd-fsdp"),
    ((*TRAIN, "--engine", "fsdp2", "--codec", "topk"), "--codec topk: --engine fsdp2 is FSDP2 as it comes, its "
                                                       "reduce-scatter in fp32, fp16, bf16; topk runs with --engine "),
    ((*TRAIN, "--shard", "node"), "--shard node lays out the sharded engine's shards: add --engine scalesgd-fsdp"),
    ((*TRAIN, "--no-auto-periodic"), "--no-auto-periodic keeps --exchange auto to per-step exchanges: add --exchange"),
    ((*TRAIN, "--auto-codecs", "fp16,fp8"), "--auto-codecs fp16,fp8 lists what --exchange auto weighs"),
    ((*TRAIN, "--local-steps", "4", "--peer", "bogus"), "--peer 'bogus' is not known; choose from '', torchft"),
    ((*TRAIN, "--local-steps", "64", "--fragments", "64"), "--fragments 64: the model has 19 layers with parameters"),
    ((*TRAIN, "--local-steps", "4", "--codec", "fp8", "--factor-wire", "fp16"),
     "--factor-wire applies to the lowrank codecs; with --local-steps the pseudo-gradient travels through --codec"),
    ((*TRAIN, "--engine", "scalesgd-fsdp", "--shard", "node", "--workers", "2"),
     "--shard node shards within each node and sums across nodes, and the 2 workers are one node"),
    ((*TRAIN, "--dataset", "imagefolder"), "--dataset imagefolder needs --data-dir: the folder holding train/<class>"),
    ((*TRAIN, "--dataset", "imagefolder", "--data-dir", "f"),
     "image folder f is a file, not a folder (expected a directory with "),
    ((*TRAIN, "--dataset", "imagefolder", "--data-dir", "prof-empty"), "prof-empty has no train/ or val/ folder"),
    ((*TRAIN, "--skip-bad-images"), "--skip-bad-images is for images streamed from a folder: it needs --dataset "),
    ((*TRAIN, "--loader-workers", "-1"), "--loader-workers -1: must be >= 0"),
    ((*TRAIN, "--augment", "heavy"), "--augment 'heavy' is not known; choose from standard, none"),
    (("data", "fake", "--out", "f"), "--out f: exists and is not a directory"),
    (("data", "fake", "--out", "t", "--size", "375"), "--size 375: give WIDTHxHEIGHT in pixels"),
    (("bench", "data", "--data-dir", "t", "--loader-workers", "1,1"), "--loader-workers 1,1: "),
    (("profile", "prof-empty"), "prof-empty/profile.json is not a profile (no entry 'profile')"),
    (("profile", "prof-garbage"), "prof-garbage/profile.json is not a profile (Expecting value"),
]


def _scene(tmp_path):
    """A file named f, and two directories whose profile.json is not a profile; what is there before."""
    (tmp_path / "f").write_text("a file")
    for name, text in (("prof-empty", "{}"), ("prof-garbage", "not json")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "profile.json").write_text(text)
    return sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("argv,expected", REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_bad_input_is_one_line_exit_2_before_anything_runs_or_is_written(tmp_path, monkeypatch, capsys, argv,
                                                                         expected):
    before = _scene(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = main(list(argv))  # in this process: an exception would fail the test, as a traceback would the user
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("scalesgd: error: ") and expected in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "f").read_text() == "a file"


def test_more_local_workers_than_gpus_is_one_line_exit_2_before_any_starts_train_or_bench(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(checks, "gpus_here", lambda: 1)  # a one-GPU machine: each worker would take cuda:LOCAL_RANK
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--workers", "16", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("scalesgd: error: --workers 16: must be at most 1 here") and "CUDA_VISIBLE_DEVICES=" in err
    assert list(tmp_path.iterdir()) == []
    code = main(["bench", "train", "--workers", "2", "--modes", "none", "--out", str(tmp_path / "bench")])
    err = capsys.readouterr().err
    assert code == 2 and err == ("scalesgd: error: --workers 2: must be at most 1 here: each worker trains on a GPU of "
                                 "its own and PyTorch sees 1; or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on "
                                 "the CPU\n"), err
    assert list(tmp_path.iterdir()) == []


def test_an_engines_earlier_name_is_one_warning_line_then_runs_under_its_name_now(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main([*TRAIN, "--engine", "fsdp", "--precision", "fp16"])
    warning, error = capsys.readouterr().err.splitlines()
    assert code == 2 and warning == ("scalesgd: warning: --engine fsdp is now scalesgd-fsdp (ours, beside fsdp2, FSDP2 "
                                     "as it comes, as scalesgd is beside ddp); fsdp still works")
    assert error.startswith("scalesgd: error: --precision fp16 with --engine scalesgd-fsdp: a loss scaler over ")


@pytest.mark.parametrize("argv,expected", [REFUSED[0], REFUSED[-1]], ids=["run-dir", "profile"])
def test_the_command_itself_says_one_line_and_exits_2(tmp_path, argv, expected):
    before = _scene(tmp_path)
    proc = scalesgd_process(*argv, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("scalesgd: error: ") and expected in proc.stderr, proc.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("command", [TRAIN, ("bench", "allreduce")])
def test_a_busy_port_is_refused_for_a_local_launch(tmp_path, busy_port, command):
    proc = scalesgd(*command, "--master-port", busy_port, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"scalesgd: error: --master-port {busy_port}: is in use on 127.0.0.1")
    assert list(tmp_path.iterdir()) == []


A_LAUNCH = {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
FOUND_TRYING = [  # what a new user ran: each killed workers with tracebacks, hung, or named the wrong thing
    ((*TRAIN, "--base-lr", "1e308", "--warmup", "none"), {},
     "--base-lr 1e+308: must lie within ±3.403e+38 (float32's range: it becomes a tensor)"),
    ((*TRAIN, "--base-lr", "1e38", "--batch-size", "1024", "--base-batch", "64"), {},
     "--base-lr 1e+38 scaled for --batch-size 1024 from --base-batch 64 (linear) gives 1.6e+39"),
    ((*TRAIN, "--codec", "fp8"), {"SCALESGD_FP8_KERNELS": "bogus"},
     "SCALESGD_FP8_KERNELS='bogus': choose from auto, compiled, eager"),
    (TRAIN, {**A_LAUNCH, "RANK": "5"}, "RANK=5 is outside the launch's WORLD_SIZE=2 (ranks 0..1)"),
    (TRAIN, {**A_LAUNCH, "RANK": "x"}, "RANK='x' is not a whole number"),
    (("bench", "train", "--modes", "scalesgd-topk@-1"), {},
     "mode 'scalesgd-topk@-1': density -1.0: must be in (0, 1]"),
]


@pytest.mark.parametrize("argv,env,expected", FOUND_TRYING, ids=[" ".join(a[2:] if a[0] == "train" else a) + (
    f" {sorted(e.items())[-1]}" if e else "") for a, e, _ in FOUND_TRYING])
def test_what_a_new_user_tried_is_one_line_and_exit_2_before_any_worker_starts(tmp_path, argv, env, expected):
    proc = scalesgd(*argv, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == f"scalesgd: error: {expected}\n" or expected in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []  # no run directory, no worker


# ---- the trial's 33 cases, each with the test that holds it ----------------------------------------------------

REFUSED_HERE = "tests.test_bad_input::test_bad_input_is_one_line_exit_2_before_anything_runs_or_is_written"
DATA = "tests.data.test_bad_data_input::"
AGREE = "tests.comm.engine.test_agreement::"
FUZZ = "tests.test_fuzz_options::"
TRIAL = {  # what a new user ran against ef7adf9 that ended silent, in a traceback, a hang or a confusing line
    "auto ran 1-bit Adam without its codec": REFUSED_HERE,
    "auto ran --momentum-correction with no exchange carrying the momentum": REFUSED_HERE,
    "auto dropped an explicit --codec": REFUSED_HERE,
    "data fake stopped by Ctrl-C: a traceback and files left":
        DATA + "test_ctrl_c_during_data_fake_says_one_line_exits_130_and_leaves_nothing",
    "an image folder cut short was trained on": DATA + "test_a_tree_whose_writing_was_cut_short_is_not_trained_on",
    "bench train --modes scalesgd-lowrank@ and …@4/":
        FUZZ + "test_an_empty_rank_or_wire_is_refused_not_taken_for_the_default",
    "an image over Pillow's pixel limit": DATA + "test_an_image_over_twice_pils_pixel_limit_is_skipped_or_named",
    "a class folder that is a symlink to itself": DATA + "test_a_class_folder_linked_to_itself_is_one_line_naming_it",
    "an image that is a symlink to itself": DATA + "test_an_image_linked_to_itself_is_named_or_skipped",
    "--image-size 100000": DATA + "test_an_image_size_past_4096_is_refused_with_its_reason",
    "data fake/export --out /proc/x and /sys/kernel/x":
        DATA + "test_a_tree_in_proc_or_sys_is_refused_naming_the_folder_and_why",
    "--gpt-block 100000 hung": "tests.models.test_gpt::test_gpt_block_100000_is_one_line_not_a_silent_hang",
    "hooks of different codecs on two ranks hung":
        AGREE + "test_hooks_with_different_codecs_raise_on_both_ranks_naming_both",
    "engines of different codecs on two ranks hung":
        AGREE + "test_engines_with_different_codecs_raise_on_both_ranks_naming_both",
    "the hook's group ignored the caller's timeout": AGREE + "test_the_engines_groups_time_out_when_the_caller_said",
    "a relative --data-file could not be resumed elsewhere":
        DATA + "test_a_runs_relative_data_file_is_stored_absolute_and_resumes_from_anywhere",
    "a short text named sequence_length":
        DATA + "test_a_too_short_text_names_gpt_block_and_the_file_and_the_bytes_needed",
    "--accumulate 1000000000": REFUSED_HERE,
    "--betas a,b": REFUSED_HERE,
    "--data-dir naming a file": DATA + "test_a_data_dir_naming_a_file_says_it_is_a_file_not_a_folder",
    "no image files, without the extensions": DATA + "test_a_class_folder_with_no_images_says_which_files_count",
    "data export --out d bogus": DATA + "test_data_export_names_an_unknown_dataset_as_the_positional_it_is",
    "--modes auto-bogus+fp32": FUZZ + "test_an_auto_mode_naming_no_known_exchange_lists_those_accepted",
    "Pillow's DecompressionBombWarning printed raw":
        DATA + "test_an_image_over_pils_pixel_limit_is_a_warning_naming_it_once",
    "CodecHookState('topk', settings={'density': 0.5})":
        AGREE + "test_settings_given_as_a_dict_are_refused_saying_how_to_build_them",
    "CodecHookState(42)":
        AGREE + "test_a_codec_that_is_neither_a_name_nor_a_codec_is_refused_naming_what_is_accepted",
    "the README's GPT line ran AdamW at SGD's rate":
        "tests.recipe.test_defaults::"
        "test_the_readme_transformer_line_runs_adamw_at_adams_rate_with_the_gpts_own_length",
    "bf16 on a CPU without native bf16, 10× slower without a word":
        "tests.config.test_rules::test_bf16_on_a_cpu_without_native_bf16_warns_with_the_measured_slowdown",
    "Muon on an AVX2 CPU, 10× slower than AdamW without a word":
        "tests.config.test_rules::test_muon_on_a_cpu_whose_onednn_has_no_bf16_warns_with_the_measured_slowdown",
    "a variance frozen before Adam's horizon, without a word":
        "tests.config.test_rules::test_a_freeze_given_before_adams_horizon_warns_and_the_default_waits_for_it",
    "the hook's freeze set to a 20-step warm-up with β2 0.99":
        "tests.optim.test_onebit_adam::test_the_freeze_defaults_to_adams_averaging_horizon_one_over_one_minus_beta2",
    "the hook's dense start and the optimizer's freeze apart": "tests.comm.engine.test_ddp_hook::"
        "test_a_hook_given_an_optimizer_that_freezes_adams_variance_starts_compressing_at_its_freeze",
}


PERIODIC = "tests.periodic."
TRAIN_TESTS = "tests.train."
TRIAL_ROUNDS = {  # what a new user ran against 1bdcfc8 (periodic rounds, shards, auto) that ended silent, in a
    # traceback or a confusing line
    "a resumed run's clock started from the wall clock's elapsed_s":
        TRAIN_TESTS + "test_loop::test_a_resumed_run_continues_the_training_clock_and_the_bytes_sent",
    "finish()'s exchanges were not in bytes_sent":
        TRAIN_TESTS + "test_loop::test_the_exchange_the_end_of_a_run_lands_is_counted_in_its_bytes",
    "--shard node on one node said nothing": REFUSED_HERE,
    "another codec's options with --local-steps were ignored": REFUSED_HERE,
    "DiLoCo over another model's optimizers, or fragments leaving parameters out":
        PERIODIC + "test_diloco::test_arguments_that_would_not_synchronise_are_refused_naming_them",
    "bench quality's 'a=… --seed=3'":
        "tests.bench.test_quality::test_an_exchange_that_sets_what_the_bench_sets_is_refused_before_any_run",
    "simulate --modes periodic@64/64 on a 19-layer model":
        "tests.sim.test_command::test_bad_input_is_one_line_and_exit_2",
    "--no-auto-periodic and --auto-codecs without --exchange auto": REFUSED_HERE,
    "--local-steps 64 --fragments 64 refused only inside the workers": REFUSED_HERE,
    "a truncated .distcp shard file on resume":
        TRAIN_TESTS + "test_checkpoint::test_a_cut_short_shard_file_resumes_from_the_checkpoint_before_or_is_one_line",
    "bench quality --reference bogus, an unclosed quote, --exchanges bogus or ';;'":
        "tests.bench.test_quality::test_a_bad_exchange_or_reference_is_one_line_naming_it",
    "periodic@16-topk@0.01 said topk is none of ours":
        "tests.sim.test_exchange::test_a_periodic_mode_that_cannot_run_is_refused",
    "DiLoCo(local_steps=1.5) and local_steps='16'":
        PERIODIC + "test_schedule::test_what_cannot_run_is_refused_naming_the_argument",
    "--peer bogus listed an empty choice as nothing": REFUSED_HERE,
    "the unknown-codec list offered powersgd":
        PERIODIC + "test_diloco::test_arguments_that_would_not_synchronise_are_refused_naming_them",
    "a step fp16's scaler skipped on one rank split the rounds":
        PERIODIC + "test_diloco::test_a_step_the_scaler_skips_on_one_rank_still_counts_there_so_rounds_stay_together",
    "docs/periodic.md named top-k, no density, no SCALESGD_FP8_KERNELS":
        PERIODIC + "test_docs::test_the_periodic_docs_name_registered_codecs_their_density_and_fp8s_compile",
}


def test_every_case_the_trial_found_has_a_test_that_exists():
    import importlib
    for case, where in {**TRIAL, **TRIAL_ROUNDS}.items():
        module, name = where.split("::")
        assert hasattr(importlib.import_module(module), name), (case, where)
