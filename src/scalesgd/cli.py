"""The `scalesgd` command: parse, validate once, dispatch. Bad input is one line and exit status 2.

Every command's options are generated from its config's fields (`scalesgd.options`); library errors
name fields in backticks, and this is the one place that shows them as --flags.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from scalesgd import output, testbed
from scalesgd.bench import BENCHES
from scalesgd.bench.launch import command_line, in_process, on_workers
from scalesgd.comm.cost import planner
from scalesgd.comm.engine.buckets import model_tensors, plan_buckets
from scalesgd.config import TrainConfig
from scalesgd.errors import EXIT_USAGE, UsageError, as_flags
from scalesgd.models import MODELS, build_model
from scalesgd.options import OptionParser, add_options, given, require_choice
from scalesgd.runtime import launcher, process_group
from scalesgd.sim import command as simulate
from scalesgd.sim.command import SimulateConfig
from scalesgd.train import checkpoint, compare, rundir, sweep, worker


def build_parser() -> argparse.ArgumentParser:
    parser = OptionParser(prog="scalesgd", description="Large-minibatch, communication-efficient data-parallel "
                          "training on PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OptionParser)
    p = sub.add_parser("train", help="train a model data-parallel with the large-minibatch recipe",
                       description="Train data-parallel on local workers (or under torchrun).")
    add_options(p, TrainConfig)
    p.add_argument("--resume", type=Path, default=argparse.SUPPRESS,
                   help="continue the run in this directory from its last checkpoint")
    p = sub.add_parser("plan", help="print the bucket plan of a model",
                       description="Show which gradients travel together, first exchanged first.")
    p.add_argument("--model", default="resnet50", help=f"{' | '.join(MODELS)}: the network whose gradients are "
                   "planned (default resnet50)")
    p.add_argument("--buckets", default="size:1", help="size:MB | growing[:FIRST_MB[:FACTOR]] | layer | single: "
                   "how gradients are grouped into messages (default size:1)")
    p.add_argument("--classes", type=int, default=1000, help="classifier outputs (default 1000)")
    p.add_argument("--in-channels", type=int, default=3, help="input channels (default 3)")
    p = sub.add_parser("profile", help="print the timing profile and plan a --planner run measured",
                       description="Show what `scalesgd train --planner dlgs|optimal` measured (per-layer "
                       "backward times, the fitted selection and message costs) and the groups it chose.")
    p.add_argument("run_dir", help="a run directory of a --planner run")
    p = sub.add_parser("compare", help="plot and tabulate several training runs side by side (fp32 against fp8 …)",
                       description="Write compare.png (loss, test accuracy and learning rate of every run against "
                       "iterations and against wall time; the log times epochs, so wall time within an epoch is "
                       "spread evenly and stretched to the run's total) and compare.md (one row per run: model, "
                       "codec, global batch, workers, final test accuracy, wall time, images/s, bytes sent per "
                       "iteration, the codec's guardrail counters), and show the table.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a `scalesgd train` run directory (finished or "
                   "cut short), or a directory holding run directories, directly or in runs/ (a `scalesgd sweep` "
                   "or `bench accuracy` --out): it stands for every run in it, in name order")
    p.add_argument("--out", default="compare", help="directory for compare.png and compare.md, created if missing "
                   "(default compare)")
    bench = sub.add_parser("bench", help="measure collectives and training speed against the baselines")
    kinds = bench.add_subparsers(dest="bench", required=True, parser_class=OptionParser)
    for kind, entry in BENCHES.items():
        add_options(kinds.add_parser(kind, help=entry.help, description=entry.description or None), entry.config)
    p = sub.add_parser("sweep", help="final error against global minibatch per scaling rule and warmup",
                       description="Train every batch × rule × warmup (× optimizer × schedule) × seed with "
                       "`scalesgd train`, one after another; options after -- go to every run. Finished runs "
                       "are kept and a cut-short run resumed when the same command runs again.")
    add_options(p, sweep.SweepConfig)
    p = sub.add_parser("simulate", help="predict iteration time and scaling of each exchange on any cluster",
                       description="Predict iteration time, exposed exchange, images/s and scaling efficiency for "
                       "worker counts and exchange modes, from a compute profile measured here (or a model's "
                       "iteration time on another device) and a cluster's links; --validate checks the model "
                       "against a `bench train` run, --preset rebuilds a seed's cluster.")
    add_options(p, SimulateConfig)
    _add_testbed(sub)
    return parser


def _add_testbed(sub) -> None:
    tb = sub.add_parser("testbed", help="a cluster of network namespaces with shaped links on this machine (root)")
    verbs = tb.add_subparsers(dest="verb", required=True, parser_class=OptionParser)
    p = verbs.add_parser("up", help="create (or keep) the testbed")
    p.add_argument("--nodes", type=int, default=2, help="nodes (network namespaces), default 2")
    p.add_argument("--procs-per-node", type=int, default=1, help="worker processes per node, default 1")
    p.add_argument("--bandwidth", default="1gbit", help="each node's link rate, both ways (default 1gbit)")
    p.add_argument("--latency", default="0", help="one-way delay added to each node's uplink, needs netem "
                   "(default 0)")
    s = verbs.add_parser("shape", help="change the running testbed's link rate in place")
    s.add_argument("--bandwidth", required=True, help="each node's link rate, both ways (a tc rate: 300mbit)")
    for name in ("up", "down", "status", "run", "shape"):
        q = {"up": p, "shape": s}.get(name) or verbs.add_parser(name, help={
            "down": "remove the testbed", "status": "show the testbed", "run": "run a command's workers in the nodes"}[name])
        q.add_argument("--prefix", default="ssgd", help="names of everything created start with this (default ssgd)")
        if name == "run":
            q.add_argument("--timeout", type=float, default=300.0,
                           help="seconds the other workers get once one has failed (default 300)")
            q.add_argument("to_run", nargs=argparse.REMAINDER, help="-- then the command, e.g. scalesgd bench link")


def train_command(options: dict) -> int:
    """`scalesgd train`: validate, then spawn workers or join a torchrun launch."""
    resume_dir = options.pop("resume", None)
    torchrun = process_group.launched_by_torchrun()
    if torchrun:
        world = int(os.environ["WORLD_SIZE"])
        if options.get("workers", world) != world:
            raise UsageError(f"`workers` {options['workers']} contradicts the launch's WORLD_SIZE {world}")
        options["workers"] = world
    if resume_dir is not None:
        cfg = checkpoint.resume_config(resume_dir, options).validate()
    else:
        cfg = TrainConfig.from_dict(options).validate()
    if torchrun:
        return worker.run(cfg, *torchrun_run_dir(cfg, resume_dir))
    if resume_dir is not None:
        rundir.write_config(cfg, resume_dir)
        return worker.spawn(cfg, resume_dir, resume=True)
    return worker.spawn(cfg, rundir.prepare_new_run(cfg), resume=False)


def torchrun_run_dir(cfg: TrainConfig, resume_dir: str | None) -> tuple[Path | None, bool]:
    """Under torchrun: (run directory, resume). A restart (torchrun --max-restarts) of a run with a --run-dir
    continues in it, from its last checkpoint where it has one; None: rank 0 makes a new one."""
    if resume_dir is not None:
        return Path(resume_dir), True
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0 and cfg.run_dir:
        return Path(cfg.run_dir), (Path(cfg.run_dir) / rundir.CHECKPOINT_NAME).exists()
    return None, False


def plan_command(options: dict) -> int:
    """`scalesgd plan`: the bucket plan of a model, as the engine would build it."""
    require_choice("model", options["model"], MODELS)
    model = build_model(options["model"], options["classes"], options["in_channels"])
    try:
        plan = plan_buckets(options["buckets"], model_tensors(model))
    except ValueError as err:
        raise UsageError(f"`buckets`: {err}") from None
    output.console().print(plan.table())
    return 0


def bench_command(kind: str, options: dict, argv: list[str]) -> int:
    """`scalesgd bench KIND`: validate, then run here, or on workers that each run this same command."""
    entry = BENCHES[kind]
    cfg = entry.config(**options).validate()
    return (on_workers if entry.on_workers else in_process)(kind, cfg, argv, entry.run)


def sweep_command(options: dict, argv: list[str]) -> int:
    """`scalesgd sweep`: validate every point, then train them in turn in this process's children."""
    return in_process("sweep", sweep.SweepConfig(**options).validate(), argv, sweep.run)


def testbed_command(options: dict) -> int:
    """`scalesgd testbed up|down|status|shape|run`."""
    try:
        if options["verb"] == "up":
            spec = testbed.TestbedSpec(options["nodes"], options["procs_per_node"], options["bandwidth"],
                                       options["latency"], options["prefix"]).validate()
            testbed.up(spec)
            print(f"testbed {spec.prefix}: {spec.nodes} nodes × {spec.procs_per_node} processes, "
                  f"{spec.bandwidth} links, {spec.latency} added latency, node 0 at {spec.address(0)}")
            return 0
        if options["verb"] == "down":
            removed = testbed.down(options["prefix"])
            print(f"removed {len(removed)} namespaces" + (f": {', '.join(removed)}" if removed else ""))
            return 0
        if options["verb"] == "status":
            print(json.dumps(testbed.status(options["prefix"]) or {"up": False}, indent=2))
            return 0
        if options["verb"] == "shape":
            spec = testbed.shape(options["prefix"], options["bandwidth"])
            print(f"testbed {spec.prefix}: links now {spec.bandwidth}")
            return 0
        return testbed.run(options["prefix"], list(options["to_run"]), options["timeout"])
    except (ValueError, testbed.TestbedError) as err:
        raise UsageError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    """Run a command; a process that joined a distributed launch ends with its launcher, and without interpreter
    teardown."""
    if argv is None:
        launcher.join_launcher()
    code = _run(argv)
    if process_group.launched_by_torchrun() and argv is None:
        process_group.exit_process(code)
    return code


def _run(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        options = given(build_parser().parse_args(argv))
        command = options.pop("command")
        if command == "train":
            return train_command(options)
        if command == "plan":
            return plan_command(options)
        if command == "profile":
            planner.show_profile(Path(options["run_dir"]))
            return 0
        if command == "testbed":
            return testbed_command(options)
        if command == "compare":
            return compare.run(options["run_dirs"], options["out"], command_line(argv))
        if command == "sweep":
            return sweep_command(options, argv)
        if command == "simulate":
            return simulate.run(SimulateConfig(**options).validate(), command_line(argv))
        return bench_command(options.pop("bench"), options, argv)
    except UsageError as err:
        print(f"scalesgd: error: {as_flags(str(err))}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
