"""`scalesgd bench quality`: the target, each run's time, steps and bytes to it, and a short real bench."""

import argparse
import json

import pytest

from scalesgd.bench.quality import EXCHANGES, QualityBenchConfig, key_of, link_of, parse_exchanges, reference_seeds
from scalesgd.bench.quality_report import checkpoints_by, reached, steps_to_target, summarise, target_of
from scalesgd.cli import main
from scalesgd.errors import UsageError
from scalesgd.sim import quality
from tests.bench.cli import bench


def run(label, losses, step=10, seconds=2.0, rate="10mbit", seed=0, final=None, bytes_per_step=1000, stopped=False):
    evals = [{"iter": step * (i + 1), "train_s": seconds * (i + 1), "test_loss": loss, "test_acc": 0.0,
              "link_bytes_sent": bytes_per_step * step * (i + 1)} for i, loss in enumerate(losses)]
    return {"label": label, "seed": seed, "rate": rate, "evals": evals, "steps": step * len(losses), "text": True,
            "train_s": seconds * len(losses), "final_test_loss": losses[-1] if final is None else final,
            "final_test_acc": 0.0, "stopped": stopped}


def test_the_target_is_the_references_median_final_loss_plus_the_slack():
    reference = [run("ddp", [3.0, 2.0]), run("ddp", [3.0, 2.2], seed=1), run("ddp", [3.0, 2.1], seed=2)]
    assert target_of(reference, 0.01) == pytest.approx(2.1 * 1.01)


def test_a_call_adding_seeds_counts_every_finished_reference_in_its_directory(tmp_path):
    for name, finished in (("ddp-seed0", True), ("ddp-seed3", False), ("ddp-fp16-seed5", True)):
        (tmp_path / name).mkdir()
        if finished:
            (tmp_path / name / "summary.json").write_text("{}")
    # seed 0 finished (kept in the target); seed 3 was cut short and another label's seed 5 is not the reference
    assert reference_seeds(tmp_path, "ddp", (1, 2)) == [0, 1, 2]
    assert reference_seeds(tmp_path / "absent", "ddp", (2, 1)) == [1, 2]


def test_time_steps_and_bytes_are_those_of_the_first_evaluation_at_the_target():
    assert reached(run("x", [3.0, 2.5, 2.0, 1.9]), 2.2, True) == (30, 6.0, 30_000)
    assert reached(run("x", [3.0, 2.5]), 2.2, True) is None
    assert reached(run("x", [3.0, 2.5], final=2.1), 2.2, True) == (20, 4.0, 20_000)  # the run's end counts


def test_the_checkpoints_seconds_to_the_target_are_those_on_the_clock_at_its_evaluation():
    kept = run("x", [3.0, 2.5, 2.0])
    for e, seconds in zip(kept["evals"], (0.0, 0.4, 0.9)):  # a checkpoint between each evaluation
        e["checkpoint_s"] = seconds
    kept["checkpoint_s"] = 1.3  # the last one, after the run's last evaluation
    rows = summarise([kept, run("before", [3.0, 2.0])], 2.2, True, reference_steps=30, bound_s=5.0)
    assert [r["checkpoint_s"] for r in rows] == [[0.9], [0.0]]  # a run from before they were on the clock: none
    assert checkpoints_by(kept, 40) == 1.3  # the run's end, not an evaluation


def test_the_summary_counts_seeds_that_reached_and_steps_within_three_times_the_references():
    runs = [run("ddp", [3.0, 2.5, 2.1]), run("ddp", [3.0, 2.6, 2.4], seed=1),
            run("diloco", [2.4, 2.0], step=50, seconds=1.0), run("diloco", [2.3, 2.1], step=50, seconds=1.0, seed=1)]
    rows = {r["label"]: r for r in summarise(runs, 2.2, True, reference_steps=30, bound_s=5.0)}
    assert rows["diloco"]["within_3x_steps"] == 0  # 100 steps > 3 × 30
    rows = {r["label"]: r for r in summarise(runs, 2.2, True, reference_steps=40, bound_s=5.0)}
    assert (rows["ddp"]["reached"], rows["ddp"]["time_s"]) == (1, [6.0])
    assert rows["diloco"]["reached"] == 2 and rows["diloco"]["time_s"] == [2.0, 2.0]
    assert rows["diloco"]["within_3x_steps"] == 2 and rows["diloco"]["steps"] == [100, 100]
    assert rows["diloco"]["bound_ratio"] == [0.4, 0.4] and rows["ddp"]["end"] == [2.1, 2.4]


def test_steps_to_target_pool_rates_and_tell_reached_from_missed_from_cut_short():
    runs = [run("ddp", [3.0, 2.5, 2.1]), run("ddp", [3.0, 2.4, 2.0], seed=1, rate="100mbit"),  # 30 steps each
            run("lossy", [3.0, 2.5, 2.3]), run("lossy", [3.0, 2.6, 2.4], seed=1, rate="100mbit"),  # all steps, missed
            run("slow", [3.0], stopped=True), run("slow", [3.0], seed=1, stopped=True),  # the budget cut both short
            run("periodic", [2.4, 2.0], step=20), run("periodic", [2.3, 2.3, 2.1], step=20, seed=1)]
    rows = summarise(runs, 2.2, True, reference_steps=30, bound_s=5.0)
    options = {"ddp": "-a", "lossy": "-b", "slow": "-c", "periodic": "-d"}
    table = steps_to_target(rows, options, lambda given: f"key{given}", 30, "here")
    assert set(table) == {"key-a", "key-b", "key-d"}  # "slow" could not tell
    assert table["key-a"].factor == 1.0 and table["key-a"].runs == 2 and table["key-a"].options == "-a"
    rows += summarise([run("slow", [3.0, 2.1], seed=2)], 2.2, True, reference_steps=30, bound_s=5.0)
    assert steps_to_target(rows, options, lambda given: given, 30, "")["-c"].factor == pytest.approx(20 / 30)
    assert table["key-b"].missed and table["key-b"].end == pytest.approx(2.35) and table["key-b"].runs == 2
    assert table["key-d"].factor == pytest.approx(50 / 30)  # the median of 40 and 60 steps


def test_a_run_under_another_optimizer_than_its_models_own_keeps_a_row_of_its_own():
    """Muon's steps to the target are not DiLoCo's under the GPT's AdamW: one key each, so neither overwrites."""
    gpt = ("--model", "gpt", "--dataset", "text")
    assert key_of(gpt, "--local-steps 16 --codec fp8") == key_of(gpt, "--local-steps 16 --optimizer adamw --codec fp8")
    assert key_of(gpt, "--local-steps 16 --codec fp8 --optimizer muon") == "periodic@16-fp8+muon"
    assert key_of(gpt, "--engine ddp --codec fp32 --optimizer muon") == "ddp+muon"
    assert key_of(("--model", "resnet8"), "--engine ddp --codec fp32") == "ddp"  # its own: momentum SGD


def test_exchanges_are_labels_of_the_table_or_label_equals_options():
    assert parse_exchanges("ddp; mine=--engine scalesgd --codec fp8") == (
        ("ddp", EXCHANGES["ddp"]), ("mine", "--engine scalesgd --codec fp8"))
    with pytest.raises(argparse.ArgumentTypeError, match="'nope' is no known exchange"):
        parse_exchanges("nope")


def test_every_exchange_of_the_benchs_own_table_is_a_valid_training_run():
    QualityBenchConfig(exchanges=tuple(EXCHANGES.items())).validate()  # a bad option raises before any run


@pytest.mark.parametrize("given", ["--codec fp8 --seed 3", "--codec fp8 --seed=3", "--codec fp8 --se 3"])
def test_an_exchange_that_sets_what_the_bench_sets_is_refused_before_any_run(given):
    cfg = QualityBenchConfig(exchanges=(("x", given),))
    with pytest.raises(UsageError, match="`seed` in 'x'"):
        cfg.validate()


@pytest.mark.parametrize("argv,words", [
    (("--exchanges", "bogus"), "--exchanges: 'bogus' is no known exchange; give LABEL=OPTIONS or one of ddp,"),
    (("--exchanges", ";;"), "--exchanges : give one exchange or more"),
    (("--reference", "bogus"), "--reference 'bogus': 'bogus' is no known exchange"),
    (("--exchanges", "a=--local-steps 'x"), "--exchanges 'a': its options \"--local-steps 'x\" do not split (No "
                                            "closing quotation)"),
    (("--rates", "10mbit@soon"), "--rates 10mbit@soon: '10mbit@soon': --latency 'soon': use 0 or a tc delay"),
    (("--rates", "fast@25ms"), "--rates fast@25ms: 'fast@25ms': --bandwidth 'fast'"),
])
def test_a_bad_exchange_or_reference_is_one_line_naming_it(capsys, argv, words):
    code = main(["bench", "quality", *argv])  # in this process: a traceback would fail the test
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err


def test_a_rate_takes_an_added_latency_after_an_at_sign():
    assert link_of("10mbit@25ms") == ("10mbit", "25ms") and link_of("100mbit") == ("100mbit", "0")


def test_a_short_bench_on_local_workers_writes_the_table_and_the_plot(tmp_path):
    out = tmp_path / "q"
    proc = bench("quality", "--exchanges", "ddp;periodic=--local-steps 4", "--seeds", "0", "--eval-every", "4",
                 "--out", str(out), "--table", str(tmp_path / "steps.json"), "--", "--workers", "2", "--dataset",
                 "synthetic", "--samples", "512", "--image-size", "8", "--model", "resnet8", "--batch-size", "64",
                 "--epochs", "1", "--warmup", "none")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "quality.json").read_text())
    assert record["metric"] == "test_acc" and [r["label"] for r in record["runs"]] == ["ddp", "periodic"]
    assert all([e["iter"] for e in r["evals"]] == [4, 8] for r in record["runs"])  # 512 / 64 = 8 steps
    assert record["budget_s"] == pytest.approx(3 * record["reference"][0]["train_s"])
    assert "| local | `periodic` |" in (out / "quality.md").read_text()
    assert (out / "quality.png").read_bytes()[:4] == b"\x89PNG"
    table = quality.table("image", tmp_path / "steps.json")  # the reference on local workers and at the link
    assert table["ddp"].factor == 1.0 and table["ddp"].runs == 2
    assert quality.table("text", tmp_path / "steps.json") == {}
    assert set(table) <= {"ddp", "periodic@4-fp32"} and set(record["steps_to_target"]) == set(table)
