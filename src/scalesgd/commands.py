"""Every `scalesgd` command, registered once: its options (a config dataclass of `option` fields, checked by its
`validate`) and its `run`. The parser, the help, the validation, the dispatch and docs/cli.md are all made from
this list (`scalesgd.cli`, `cli_markdown`); a command is its config and its run plus one `COMMANDS.add`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from scalesgd import checks
from scalesgd.bench import (
    accuracy,
    allreduce,
    codec,
    data,
    elastic,
    faults,
    fp8_range,
    link,
    optimizer,
    quality,
)
from scalesgd.bench import train as bench_train
from scalesgd.bench.elastic import schedule as elastic_schedule
from scalesgd.bench.elastic import train as elastic_train
from scalesgd.bench.launch import command_line, in_process, on_workers
from scalesgd.comm.codecs.fp8 import kernels
from scalesgd.data import command as data_trees
from scalesgd.errors import UsageError
from scalesgd.options import (
    Options,
    build,
    default_text,
    describe,
    flat_options,
    option,
)
from scalesgd.registry import Registry
from scalesgd.sim import command as simulate
from scalesgd.sim.plans import PlanCommand, ProfileCommand, show_plan, show_profile
from scalesgd.testbed import command as testbed
from scalesgd.train import command as train
from scalesgd.train import compare, sweep

DOCS_CLI = "docs/cli.md"


@dataclass(frozen=True)
class Command:
    """A command: its options (an `options.Options` dataclass), what runs it (with the validated config and the
    command line as typed), its help."""

    config: type
    run: Callable[[Any, list[str]], int]
    help: str
    description: str = ""

    def configure(self, given: dict):
        """The validated config from the options given (by flat name), the environment checked first; UsageError
        naming the first bad one."""
        for problem in (check() for check in ENVIRONMENT_CHECKS):
            if problem:
                raise UsageError(problem)
        make = getattr(self.config, "from_options", None)
        config = make(given) if make is not None else build(self.config, given)
        return config.validate()


COMMANDS: Registry[Command] = Registry("command")
ENVIRONMENT_CHECKS = (checks.launch_problem, kernels.environment_problem)  # settings a command reads from the environment
GROUPS = {  # commands named "GROUP VERB" are VERB under GROUP
    "bench": "measure collectives and training speed against the baselines",
    "testbed": "a cluster of network namespaces with shaped links on this machine (root)",
    "data": "image folder trees in the ImageNet layout, generated or exported",
    "docs": "documents made from the code",
}


def _line(run: Callable[[Any, str], int]) -> Callable[[Any, list[str]], int]:
    """A run that wants the command line as one string (written beside its results)."""
    return lambda cfg, argv: run(cfg, command_line(argv))


@dataclass
class DocsCli(Options):
    """`scalesgd docs cli`: where the reference of every command and option goes."""

    out: str = option(DOCS_CLI, "the Markdown file to write", check=checks.output_file)


def write_cli_docs(cfg: DocsCli, argv: list[str]) -> int:
    Path(cfg.out).write_text(cli_markdown(), encoding="utf-8")
    print(f"written to {cfg.out}")
    return 0


def cli_markdown() -> str:
    """docs/cli.md: every command, its help and a table of its options (flag, default, what it does), by group."""
    lines = ["# The `scalesgd` command line", "",
             "Every command and option, made from their declarations by `scalesgd docs cli` (a test fails when this "
             "file is stale). `scalesgd COMMAND --help` says the same.", ""]
    for name, command in COMMANDS.items():
        lines += [f"## `scalesgd {name}`", "", command.help[0].upper() + command.help[1:] + "."]
        if command.description:
            lines += ["", command.description]
        groups: dict[str, list] = {}
        for flat in flat_options(command.config):
            groups.setdefault(flat.group, []).append(flat)
        for group, flats in groups.items():
            lines += ["", f"*{group}*", ""] if group else [""]
            lines += ["| option | default | what it does |", "|---|---|---|"]
            for flat in flats:
                meta = flat.field.metadata
                shown = (flat.name.upper() if meta["positional"] is not None else
                         f"-- {flat.name.upper()}…" if meta["remainder"] else flat.flag)
                cell = describe(flat.field).replace("|", "\\|")
                lines.append(f"| `{shown}` | {default_text(flat.field) or '—'} | {cell} |")
        lines.append("")
    return "\n".join(lines)


COMMANDS.add("train", Command(train.TrainCommand, train.run, "train a model data-parallel with the large-minibatch "
                                                             "recipe", "Train data-parallel on local workers (or "
                                                             "under torchrun)."))
COMMANDS.add("plan", Command(PlanCommand, show_plan, "print the bucket plan of a model",
                             "Show which gradients travel together, first exchanged first."))
COMMANDS.add("profile", Command(ProfileCommand, show_profile, "print the timing profile and plan a --planner run "
                                "measured", "Show what `scalesgd train --planner dlgs|optimal` measured (per-layer "
                                "backward times, the fitted selection and message costs) and the groups it chose."))
COMMANDS.add("compare", Command(compare.CompareCommand, _line(compare.run), "plot and tabulate several training runs "
                                "side by side (fp32 against fp8 …)", "Write compare.png (loss, test accuracy and "
                                "learning rate of every run against iterations and against wall time; the log times "
                                "epochs, so wall time within an epoch is spread evenly and stretched to the run's "
                                "total) and compare.md (one row per run: model, codec, global batch, workers, final "
                                "test accuracy, wall time, images/s, bytes sent per iteration, the codec's guardrail "
                                "counters), and show the table."))
for kind, config, run, help_, workers, description in [
    ("allreduce", allreduce.AllreduceBenchConfig, allreduce.run,
     "time and bus bandwidth of each allreduce algorithm against size", True, ""),
    ("train", bench_train.TrainBenchConfig, bench_train.run,
     "iteration time of each exchange mode against DDP, side by side", True, ""),
    ("codec", codec.CodecBenchConfig, codec.run,
     "fp8 kernel throughput, fused (torch.compile) against eager, one process", False, ""),
    ("fp8-range", fp8_range.Fp8RangeBenchConfig, fp8_range.run,
     "fp8's range settings (quantile × headroom) on real gradients: error, clipping, flushing", False, ""),
    ("data", data.DataBenchConfig, data.run,
     "images/s an image folder is decoded and augmented at, per loader worker, beside the model's step", False, ""),
    ("optimizer", optimizer.OptimizerBenchConfig, optimizer.run,
     "time of one optimizer step() (LARS, LAMB, AdamW, Muon) against torch's SGD, one process", False, ""),
    ("accuracy", accuracy.AccuracyBenchConfig, accuracy.run,
     "final test accuracy of training variants, median over seeds", False,
     "Run `scalesgd train` for every variant × seed, one after another; options after -- go to every run. Finished "
     "runs are kept and cut-short runs resumed when the same command runs again."),
    ("quality", quality.QualityBenchConfig, quality.run,
     "time to the reference's quality of every exchange, per link rate: DDP and its hooks, ours, periodic", False,
     "Train the reference exchange (DDP fp32) once per seed on local workers (its final loss + 1 % is the target, its "
     "time to it the compute-only bound), then every exchange × seed at each testbed rate (`scalesgd testbed up "
     "--nodes N` first), each evaluated every --eval-every steps on a clock that leaves evaluations out and stopped "
     "at --budget × the reference's time. Writes quality.{json,md,png}; finished runs are kept when the same command "
     "runs again."),
    ("link", link.LinkBenchConfig, link.run,
     "throughput and round trip between node 0 and node 1 (run it in the testbed)", True, ""),
    ("faults", faults.FaultsBenchConfig, faults.run,
     "faults injected into short training runs: seconds to the end and whether the outcome is the promised one",
     False, ""),
    ("elastic", elastic.ElasticBenchConfig, elastic.run,
     "DiLoCo rounds among whoever is alive under faults: seconds from each fault to the next committed round",
     False, ""),
    ("elastic-train", elastic_train.ElasticTrainBenchConfig, elastic_train.run,
     "a worker killed in `scalesgd train --local-steps`: elastic (restarted alone) against the restart of every "
     "worker, in wall time, the time the fault cost and final accuracy", False, ""),
    ("elastic-schedule", elastic_schedule.ScheduleBenchConfig, elastic_schedule.run,
     "training on the testbed under a failure schedule (a kill, a frozen node, a link down, in turn): elastic "
     "rounds against the restart of every worker and the fault-free run, in time to the target loss and goodput",
     False, ""),
]:
    COMMANDS.add(f"bench {kind}", Command(config, partial(on_workers if workers else in_process, kind, run), help_,
                                          description))
COMMANDS.add("sweep", Command(sweep.SweepConfig, partial(in_process, "sweep", sweep.run), "final error against "
                              "global minibatch per scaling rule and warmup", "Train every batch × rule × warmup "
                              "(× optimizer × schedule) × seed with `scalesgd train`, one after another; options "
                              "after -- go to every run. Finished runs are kept and a cut-short run resumed when the "
                              "same command runs again."))
COMMANDS.add("simulate", Command(simulate.SimulateConfig, _line(simulate.run), "predict iteration time and scaling "
                                 "of each exchange on any cluster", "Predict iteration time, exposed exchange, "
                                 "images/s and scaling efficiency for worker counts and exchange modes, from a "
                                 "compute profile measured here (or a model's iteration time on another device) and "
                                 "a cluster's links; --validate checks the model against a `bench train` run, "
                                 "--preset rebuilds a paper's cluster."))
COMMANDS.add("testbed up", Command(testbed.TestbedUp, testbed.up, "create (or keep) the testbed"))
COMMANDS.add("testbed down", Command(testbed.TestbedPrefix, testbed.down, "remove the testbed"))
COMMANDS.add("testbed status", Command(testbed.TestbedPrefix, testbed.status, "show the testbed"))
COMMANDS.add("testbed shape", Command(testbed.TestbedShape, testbed.shape,
                                      "change the running testbed's link rate in place"))
COMMANDS.add("testbed run", Command(testbed.TestbedRun, testbed.run, "run a command's workers in the nodes"))
COMMANDS.add("data fake", Command(data_trees.FakeTree, data_trees.fake, "write an ImageNet-like folder tree of "
                                  "generated JPEGs", "Write DIR/train/<class>/*.JPEG and DIR/val/<class>/*.JPEG: "
                                  "real JPEGs whose classes differ in colour and stripes, for `scalesgd train "
                                  "--dataset imagefolder` and `scalesgd bench data`."))
COMMANDS.add("data export", Command(data_trees.ExportTree, data_trees.export, "write a bundled dataset as an image "
                                    "folder tree"))
COMMANDS.add("docs cli", Command(DocsCli, write_cli_docs, "write docs/cli.md: every command and option, from their "
                                 "declarations"))
