"""`scalesgd bench quality`: how soon each exchange brings the model to its quality on a given link.

First the reference exchange (DDP fp32) trains on local workers with nothing in the way, once per seed: its final
validation loss + 1 % (a classifier's accuracy − 0.5 points) is the target, and its time to it the compute-only
bound; every seed's reference already in `--out` counts, so seeds added later meet the same target. Then, at each
link rate of the testbed, every exchange trains once per seed (the exchanges taking turns, so a slow spell of the
machine hits them alike) with an evaluation every `--eval-every` steps on a clock that leaves evaluations out, for
at most `--budget` × the reference's training time; the report gives each one's time, steps and bytes to the
target, its loss at the budget, and the plot its loss against the clock.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from scalesgd import checks, testbed
from scalesgd.bench import quality_report
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError
from scalesgd.options import Options, ints, option, parse, words
from scalesgd.sim.quality import key_of as quality_key
from scalesgd.train import metrics
from scalesgd.train.rundir import METRICS_NAME, SUMMARY_NAME
from scalesgd.train.study import failed, train_once

# every exchange a user could pick, by label: DDP and PyTorch's hooks, ours per step, ours every H steps
EXCHANGES = {
    "ddp": "--engine ddp --codec fp32",
    "ddp-fp16": "--engine ddp --codec fp16",
    "ddp-powersgd4": "--engine ddp --codec powersgd --rank 4",
    "ddp-powersgd8": "--engine ddp --codec powersgd --rank 8",
    "fp16": "--engine scalesgd --codec fp16",
    "fp8": "--engine scalesgd --codec fp8",
    "topk-mc": "--engine scalesgd --codec topk --density 0.01 --momentum-correction",
    "onebit": "--engine scalesgd --codec onebit --optimizer onebit-adam",
    "lowrank8": "--engine scalesgd --codec lowrank --rank 8 --factor-wire fp16",
    "lowrank-acp8": "--engine scalesgd --codec lowrank-acp --rank 8 --factor-wire fp16",
    "diloco-h10": "--local-steps 10 --codec fp32",
    "diloco-h50": "--local-steps 50 --codec fp32",
    "diloco-h50-fp8": "--local-steps 50 --codec fp8",
    "diloco-h50-topk": "--local-steps 50 --codec topk --density 0.05 --density-warmup 0",
    "streaming-h50": "--local-steps 50 --fragments 5 --overlap-steps 5 --mix 0.5 --codec fp8",
}
SETS = ("seed", "run_dir", "resume", "eval_every", "time_budget")  # train options the bench sets per run


def parse_exchanges(text: str) -> tuple[tuple[str, str], ...]:
    """(label, train options) per entry of ';'-separated LABEL (from `EXCHANGES`) or LABEL=OPTIONS (an
    `argparse.ArgumentTypeError` saying what is wrong, which the command line shows as it is)."""
    out = []
    for entry in (e.strip() for e in text.split(";") if e.strip()):
        label, _, given = entry.partition("=")
        label = label.strip()
        if not given and label not in EXCHANGES:
            raise argparse.ArgumentTypeError(f"{label!r} is no known exchange; give LABEL=OPTIONS or one of "
                                             f"{', '.join(EXCHANGES)}")
        out.append((label, given.strip() if given else EXCHANGES[label]))
    return tuple(out)


def link_of(entry: str) -> tuple[str, str]:
    """A `--rates` entry's (rate, one-way latency): 10mbit@25ms → (10mbit, 25ms); no @: no latency."""
    rate, _, latency = entry.partition("@")
    return rate, latency or "0"


def _rates_problem(rates: tuple[str, ...]) -> str | None:
    for entry in rates:
        rate, latency = link_of(entry)
        try:
            testbed.TestbedSpec(bandwidth=rate, latency=latency).validate()
        except ValueError as err:
            return f"{entry!r}: {err}"
    return checks.distinct(rates) if rates else None


def _exchanges_problem(given: tuple[tuple[str, str], ...]) -> str | None:
    if not given:
        return "give one exchange or more (LABEL or LABEL=OPTIONS, ';'-separated)"
    return None if len({label for label, _ in given}) == len(given) else "give distinct labels"


@dataclass
class QualityBenchConfig(Options):
    """`scalesgd bench quality`: time to a target validation loss (or accuracy) of every exchange, per link rate."""

    exchanges: tuple[tuple[str, str], ...] = option(
        tuple((k, v) for k, v in EXCHANGES.items() if k != "ddp-powersgd8"),
        "';'-separated exchanges: a label of the bench's own table (" + ", ".join(EXCHANGES) + ") or "
        "LABEL=TRAIN OPTIONS", parse=lambda text: parse_exchanges(text), shown_default="every one but ddp-powersgd8",
        check=_exchanges_problem)
    reference: str = option("ddp", "the exchange whose final quality, + --slack, is the target, and whose time to it "
                            "on local workers is the compute-only bound (LABEL=OPTIONS or a label)")
    seeds: tuple[int, ...] = option((0, 1, 2), "each exchange trains once per seed", parse=ints,
                                    check=checks.all_of(checks.distinct, checks.each(checks.seed)))
    rates: tuple[str, ...] = option((), "testbed links, each a run of every exchange: a rate, and an added one-way "
                                    "latency after @ (e.g. 10mbit,10mbit@25ms,100mbit); none: local workers on "
                                    "loopback", parse=words, check=lambda rates: _rates_problem(rates))
    prefix: str = option("ssgd", "the testbed (`scalesgd testbed up --nodes WORKERS`) the rates are set on")
    eval_every: int = option(16, "steps between evaluations", check=checks.at_least(1))
    budget: float = option(3.0, "each run's training time at most this × the reference's on local workers",
                           check=checks.within(0, 100, low_open=True))
    slack: float = option(0.01, "the target: the reference's final validation loss × (1 + this), or its accuracy − "
                          "this/2 (0.005: half a point)", check=checks.within(0, 1))
    out: str = option("", "output directory; runs finished there are kept, and the target and bound are those of "
                      "every seed's reference there, so seeds added by a later call meet the same target",
                      shown_default="runs/bench/quality-<timestamp>", check=checks.output_dir)
    table: str = option("", "also merge each exchange's steps to the target over the reference's into this "
                        "steps-to-target table (the package ships src/scalesgd/sim/steps_to_target.json, which "
                        "`simulate` and `--exchange auto` read)")
    train_args: tuple[str, ...] = option((), "-- then options for every run", remainder=True)

    def validate(self) -> QualityBenchConfig:
        """Every option, then every exchange as the training run it is, before any run starts."""
        super().validate()
        try:
            entries = (*self.exchanges, self.reference_entry)
        except argparse.ArgumentTypeError as err:
            raise UsageError(f"`reference` {self.reference!r}: {err}") from None
        for label, given in entries:
            try:
                argv = [*self.train_args, *shlex.split(given)]
            except ValueError as err:  # an unclosed quote
                raise UsageError(f"`exchanges` {label!r}: its options {given!r} do not split ({err})") from None
            owned = [f"`{name}`" for name in SETS if name in parse(TrainConfig, argv, "scalesgd train")]
            if owned:
                raise UsageError(f"{', '.join(owned)} in {label!r}: the bench sets it per run")
            TrainConfig.from_argv(argv)
        return self

    @property
    def reference_entry(self) -> tuple[str, str]:
        entries = parse_exchanges(self.reference)
        if len(entries) != 1:
            raise argparse.ArgumentTypeError("give one exchange, LABEL or LABEL=OPTIONS")
        return entries[0]


def run(cfg: QualityBenchConfig, command: str) -> int:
    """The reference per seed on local workers, then every exchange per rate and seed; the report."""
    out = Path(cfg.out)
    label, given = cfg.reference_entry
    reference = []
    for seed in reference_seeds(out / "reference", label, cfg.seeds):
        run_dir = out / "reference" / f"{label}-seed{seed}"
        code = train_once(argv_of(cfg, given, seed, 0.0), run_dir, f"reference {label} · seed {seed}")
        if code:
            return failed(f"reference {label} seed {seed}", code, run_dir)
        reference.append(read_run(run_dir, label, seed, "local"))
    budget_s = cfg.budget * max(r["train_s"] for r in reference)
    runs = []
    for rate in cfg.rates or ("local",):
        shaped = rate == "local"
        for seed in cfg.seeds:
            for label, given in cfg.exchanges:  # in turn: a slow spell of the machine hits every one alike
                run_dir = out / rate / f"{label}-seed{seed}"
                if not shaped and not (run_dir / SUMMARY_NAME).exists():  # finished runs need no testbed
                    testbed.shape(cfg.prefix, *link_of(rate))
                    shaped = True
                code = train_on(cfg, rate, argv_of(cfg, given, seed, budget_s), run_dir,
                                f"{rate} · {label} · seed {seed}")
                if code:
                    return failed(f"{label} at {rate} seed {seed}", code, run_dir)
                runs.append(read_run(run_dir, label, seed, rate))
    quality_report.write(out, cfg, reference, runs, budget_s, command, partial(key_of, cfg.train_args))
    return 0


def reference_seeds(directory: Path, label: str, seeds: tuple[int, ...]) -> list[int]:
    """The call's seeds and every seed whose reference already finished in `directory`: a call that adds seeds to
    an --out is measured against the same target, bound and budget as the runs already there."""
    kept = {int(d.name.removeprefix(f"{label}-seed")) for d in directory.glob(f"{label}-seed*")
            if d.name.removeprefix(f"{label}-seed").isdigit() and (d / SUMMARY_NAME).exists()}
    return sorted(kept | set(seeds))


def key_of(train_args: tuple[str, ...], given: str) -> str:
    """The steps-to-target table's name of the exchange a run with these options trains with, and of its optimizer
    where not the model's own ("" for auto: its exchange is chosen as the run starts, and the table is what it
    chooses by)."""
    run = TrainConfig.from_argv([*train_args, *shlex.split(given)])
    x, p = run.exchange, run.periodic
    if x.auto:
        return ""
    return quality_key(x.engine, x.codec, p.schedule, p.peer, run.other_optimizer)


def argv_of(cfg: QualityBenchConfig, given: str, seed: int, budget_s: float) -> list[str]:
    return [*cfg.train_args, *shlex.split(given), "--seed", str(seed), "--eval-every", str(cfg.eval_every),
            "--time-budget", f"{budget_s:.3f}"]


def train_on(cfg: QualityBenchConfig, rate: str, train_argv: list[str], run_dir: Path, label: str) -> int:
    """One run: on local workers (rate "local"), else one worker per testbed node."""
    if rate == "local":
        return train_once(train_argv, run_dir, label)
    if (run_dir / SUMMARY_NAME).exists():
        return 0
    if run_dir.exists():  # cut short: its clock and link counters restart with it, so the run starts again
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    print(label, flush=True)
    return subprocess.run([sys.executable, "-m", "scalesgd", "testbed", "run", "--prefix", cfg.prefix, "--",
                           "scalesgd", "train", *train_argv, "--run-dir", str(run_dir), "--quiet"]).returncode


def read_run(run_dir: Path, label: str, seed: int, rate: str) -> dict:
    """A run's evaluations (iteration, training seconds, bytes, loss or accuracy) and its summary's figures."""
    summary = json.loads((run_dir / SUMMARY_NAME).read_text())
    records = metrics.read(run_dir / METRICS_NAME)
    evals = [r for r in records if r.get("kind") == "eval"]
    steps = max((r["iter"] for r in records if r.get("kind") == "iter"), default=0)
    return {"label": label, "seed": seed, "rate": rate, "run_dir": str(run_dir), "train_s": summary["train_s"],
            "workers": summary.get("world_size", 2),
            "steps": steps, "text": "final_test_perplexity" in summary,
            "final_test_loss": summary.get("final_test_loss"),
            "final_test_acc": summary["final_test_acc"], "stopped": bool(summary.get("stopped_by_time_budget")),
            "checkpoint_s": summary.get("checkpoint_s", 0.0),
            "checkpoint_link_bytes": summary.get("checkpoint_link_bytes"),
            "evals": [{k: r[k] for k in ("iter", "train_s", "bytes_sent", "link_bytes_sent", "test_loss", "test_acc",
                                         "checkpoint_s", "checkpoint_link_bytes") if k in r} for r in evals]}
