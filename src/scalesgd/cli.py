"""The `scalesgd` command: parse, validate once, dispatch. Bad input is one line and exit status 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scalesgd.config import (ALGORITHM_CHOICES, BENCH_EXCHANGES, BENCH_OPTIMIZERS, DATASET_CHOICES, ENGINE_CHOICES,
                             MODEL_CHOICES, OPTIMIZER_CHOICES, AccuracyBenchConfig, AllreduceBenchConfig,
                             CodecBenchConfig, LinkBenchConfig, OptimizerBenchConfig, SweepConfig, TrainBenchConfig,
                             TrainConfig)
from scalesgd.errors import EXIT_USAGE, UsageError
from scalesgd.recipe import SCALING_RULES, SCHEDULES, WARMUPS


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option as one line (no usage dump) with exit status 2."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


def _milestones(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of epochs") from None


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model data-parallel with the large-minibatch recipe",
                       description="Train data-parallel on local workers (or under torchrun).",
                       argument_default=argparse.SUPPRESS)
    d = TrainConfig()
    g = p.add_argument_group("workers")
    g.add_argument("--workers", type=int, help=f"local worker processes (default {d.workers}); "
                   "under torchrun the launch decides")
    g.add_argument("--engine", help=f"gradient exchange: {' | '.join(ENGINE_CHOICES)} (default {d.engine})")
    g.add_argument("--codec", help="what travels: fp32 | fp16 | bf16 | fp8 | fp8-direct | fp8-flat; with ddp also "
                   "powersgd, with scalesgd also topk | topk-global | lags (default fp32); with ddp, "
                   "fp16/bf16/powersgd are PyTorch's own comm hooks, fp8* ours")
    g.add_argument("--algorithm", help=f"scalesgd allreduce: {' | '.join(ALGORITHM_CHOICES)} (default {d.algorithm})")
    g.add_argument("--buckets", help=f"scalesgd bucket plan: size:MB | growing[:FIRST_MB[:FACTOR]] | layer | single "
                   f"(default {d.buckets})")
    g.add_argument("--procs-per-node", type=int,
                   help="processes per node for hierarchical exchange (default: LOCAL_WORLD_SIZE)")
    g.add_argument("--fp8-eps", type=float, help=f"ε of fp8's relative data g/(|w|+ε) (default {d.fp8_eps:g})")
    g.add_argument("--fp8-quantile", type=float,
                   help=f"fp8 range: this quantile of |data| maps to the top (default {d.fp8_quantile:g})")
    g.add_argument("--fp8-period", type=int, help=f"fp8 range re-estimated every N steps (default {d.fp8_period})")
    g.add_argument("--fp8-samples", type=int, help=f"elements sampled per tensor for it (default {d.fp8_samples})")
    g.add_argument("--density", type=float, help=f"topk / topk-global / lags: fraction of each group's entries sent "
                   f"(default {d.density:g})")
    g.add_argument("--topk-reuse", type=int, help=f"topk: exact threshold recomputed every S steps, reused between "
                   f"(default {d.topk_reuse})")
    g.add_argument("--planner", help="topk: merge layers into groups from a measured timing model, greedily (dlgs) "
                   "or exactly (optimal); default none (--buckets decides)")
    g.add_argument("--trace", help="write a Chrome trace (open in Perfetto) of the last epoch to this file")
    g.add_argument("--timeout", type=float, help=f"seconds any collective may wait (default {d.timeout:g})")
    g.add_argument("--master-addr", help=f"rendezvous address (default {d.master_addr})")
    g.add_argument("--master-port", type=int, help="rendezvous port (default: a free one)")
    g.add_argument("--threads", type=int, help="compute threads per worker (default: cores / workers)")
    g = p.add_argument_group("data and model")
    g.add_argument("--dataset", help=f"{' | '.join(DATASET_CHOICES)} (default {d.dataset})")
    g.add_argument("--data-dir", help="folder holding cifar-10-batches-py (cifar10)")
    g.add_argument("--samples", type=int, help=f"synthetic training samples (default {d.samples})")
    g.add_argument("--image-size", type=int, help=f"synthetic image side (default {d.image_size})")
    g.add_argument("--classes", type=int, help=f"synthetic classes (default {d.classes})")
    g.add_argument("--model", help=f"{' | '.join(MODEL_CHOICES)} (default {d.model})")
    g = p.add_argument_group("large-minibatch recipe")
    g.add_argument("--batch-size", type=int, help=f"global minibatch kn (default {d.batch_size})")
    g.add_argument("--epochs", type=int, help=f"(default {d.epochs})")
    g.add_argument("--base-lr", type=float, help=f"rate tuned at --base-batch (default {d.base_lr})")
    g.add_argument("--base-batch", type=int, help=f"(default {d.base_batch})")
    g.add_argument("--lr-scaling", help=f"{' | '.join(SCALING_RULES)} (default {d.lr_scaling})")
    g.add_argument("--warmup", help=f"{' | '.join(WARMUPS)} (default {d.warmup})")
    g.add_argument("--warmup-epochs", type=float, help=f"(default {d.warmup_epochs:g})")
    g.add_argument("--schedule", help=f"{' | '.join(SCHEDULES)} (default {d.schedule})")
    g.add_argument("--milestones", type=_milestones,
                   help="step-schedule epochs, comma-separated (default: 30,60,80 of 90 scaled)")
    g.add_argument("--gamma", type=float, help=f"step schedule: factor at each milestone (default {d.gamma:g})")
    g.add_argument("--power", type=float, help=f"poly schedule power (default {d.power:g})")
    g.add_argument("--end-lr", type=float, help=f"cosine / poly: the rate they end at (default {d.end_lr:g})")
    g.add_argument("--arccot-epoch", type=float, help="arccot schedule: epoch e where the rate is half the peak "
                   "(default: half of --epochs)")
    g.add_argument("--arccot-slope", type=float, help=f"arccot schedule: a in arccot(a·(epoch − e))/π "
                   f"(default {d.arccot_slope:g})")
    g.add_argument("--optimizer", help=f"{' | '.join(OPTIMIZER_CHOICES)}: momentum SGD, or LARS's per-layer rate "
                   f"(default {d.optimizer})")
    g.add_argument("--trust-coefficient", type=float, help=f"LARS trust coefficient (default {d.trust_coefficient:g})")
    g.add_argument("--momentum", type=float, help=f"(default {d.momentum})")
    g.add_argument("--nesterov", action="store_true")
    g.add_argument("--weight-decay", type=float, help=f"(default {d.weight_decay:g}); never on BN γ/β")
    g.add_argument("--no-bias-decay", dest="bias_decay", action="store_false", help="no decay on biases")
    g.add_argument("--no-zero-gamma", dest="zero_gamma", action="store_false",
                   help="γ = 1 on the last BN of residual blocks")
    g.add_argument("--bn-momentum", type=float, help=f"weight of each batch in BN's running statistics "
                   f"(default {d.bn_momentum:g})")
    g.add_argument("--bn-batch", type=int, help="BN statistics over groups of N samples, as N samples per worker "
                   "would give (ghost batch norm); 0: each worker's whole batch (default)")
    g.add_argument("--label-smoothing", type=float, help=f"(default {d.label_smoothing:g})")
    g.add_argument("--seed", type=int, help=f"(default {d.seed})")
    g = p.add_argument_group("output")
    g.add_argument("--run-dir", help="where results go (default runs/<timestamp>)")
    g.add_argument("--resume", type=Path, help="continue the run in this directory from its last checkpoint")
    g.add_argument("--quiet", action="store_true", help="print nothing while training")


def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="print the bucket plan of a model",
                       description="Show which gradients travel together, first exchanged first.")
    p.add_argument("--model", default="resnet50", help=f"{' | '.join(MODEL_CHOICES)} (default resnet50)")
    p.add_argument("--buckets", default="size:1", help="size:MB | growing[:FIRST_MB[:FACTOR]] | layer | single")
    p.add_argument("--classes", type=int, default=1000, help="classifier outputs (default 1000)")
    p.add_argument("--in-channels", type=int, default=3, help="input channels (default 3)")


def _add_profile(sub) -> None:
    p = sub.add_parser("profile", help="print the timing profile and plan a --planner run measured",
                       description="Show what `scalesgd train --planner dlgs|optimal` measured (per-layer "
                       "backward times, the fitted selection and message costs) and the groups it chose.")
    p.add_argument("run_dir", help="a run directory of a --planner run")


def profile_command(args: dict) -> int:
    """`scalesgd profile RUN_DIR`: the saved profile, the fitted models, the groups and predictions."""
    import json
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from scalesgd.train.planning import PROFILE_NAME

    path = Path(args["run_dir"]) / PROFILE_NAME
    if not path.is_file():
        raise UsageError(f"no {PROFILE_NAME} in {args['run_dir']}; "
                         "it is written by `scalesgd train --planner dlgs|optimal`")
    saved = json.loads(path.read_text())
    prof = saved["profile"]
    group_of = {layer: g for g, group in enumerate(saved["groups"]) for layer in group}
    table = Table(title=f"profile: forward {1e3 * prof['t_f']:.2f} ms, {prof['world_size']} ranks, "
                        f"density {prof['density']:g}, threshold reused {prof['reuse']} steps")
    for column in ("layer", "tensor", "elements", "backward ms", "group"):
        table.add_column(column, justify="left" if column == "tensor" else "right")
    for i in range(len(prof["sizes"]) - 1, -1, -1):
        table.add_row(str(i), prof["names"][i], f"{prof['sizes'][i]:,}", f"{1e3 * prof['t_b'][i]:.3f}",
                      str(group_of[i]))
    console = Console()
    console.print(table)
    (alpha, beta), (a, b) = prof["comm"], prof["sparsify"]
    console.print(f"message of d elements: {1e3 * alpha:.3f} ms + {1e9 * beta:.3f} ns·d; "
                  f"selection: {1e3 * a:.3f} ms + {1e9 * b:.3f} ns·d", highlight=False)
    console.print(f"{len(saved['groups'])} groups; predicted iteration {1e3 * saved['predicted_iteration_s']:.1f} ms "
                  f"(unmerged {1e3 * saved['predicted_unmerged_s']:.1f} ms, one group "
                  f"{1e3 * saved['predicted_single_group_s']:.1f} ms)", highlight=False)
    return 0


def plan_command(args: dict) -> int:
    """`scalesgd plan`: the bucket plan of a model, as the engine would build it."""
    from rich.console import Console

    from scalesgd.comm.buckets import model_tensors, plan_buckets
    from scalesgd.models import build_model

    if args["model"] not in MODEL_CHOICES:
        raise UsageError(f"--model {args['model']!r} is not known; choose from {', '.join(MODEL_CHOICES)}")
    try:
        plan = plan_buckets(args["buckets"], model_tensors(build_model(args["model"], args["classes"],
                                                                       args["in_channels"])))
    except ValueError as err:
        raise UsageError(f"--buckets: {err}") from None
    Console().print(plan.table())
    return 0


def _sizes(text: str) -> tuple[int, ...]:
    """Element counts like 256,4K,1M (K = 1024, M = 1024²)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return tuple(int(float(part[:-1]) * scale[part[-1].upper()]) if part[-1].upper() in scale else int(part)
                     for part in (p.strip() for p in text.split(",")) if part)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of element counts like 256,4K,1M") from None


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(w) for w in _words(text))


def _add_study(p, default_out: str) -> None:
    """The options of commands that run `scalesgd train` once per point: output, and -- the shared train options."""
    p.add_argument("--out", help=f"output directory (default {default_out})")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then options for every run")


def _train_args(given: dict) -> None:
    """The train options after `--`, without it."""
    rest = given.get("train_args", [])
    given["train_args"] = tuple(rest[1:] if rest[:1] == ["--"] else rest)


def _add_runtime(p, workers: int) -> None:
    """Options every multi-worker command shares."""
    p.add_argument("--workers", type=int, help=f"local workers (default {workers}); under torchrun the launch decides")
    p.add_argument("--procs-per-node", type=int, help="processes per node for hierarchical (default LOCAL_WORLD_SIZE)")
    p.add_argument("--out", help="output directory (default runs/bench/<kind>-<timestamp>)")
    p.add_argument("--timeout", type=float, help="seconds any collective may wait (default 300)")
    p.add_argument("--master-addr", help="rendezvous address (default 127.0.0.1)")
    p.add_argument("--master-port", type=int, help="rendezvous port (default: a free one)")
    p.add_argument("--threads", type=int, help="compute threads per worker (default: cores / workers)")


def _add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="measure collectives and training speed against the baselines")
    kinds = bench.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    p = kinds.add_parser("allreduce", help="time and bus bandwidth of each allreduce algorithm against size",
                         argument_default=argparse.SUPPRESS)
    d = AllreduceBenchConfig()
    _add_runtime(p, d.workers)
    p.add_argument("--sizes", type=_sizes, help="element counts, e.g. 256,4K,64K,1M,16M (K = 1024)")
    p.add_argument("--algorithms", type=_words, help=f"comma-separated from {', '.join(BENCH_EXCHANGES)} "
                   f"(default {','.join(d.algorithms)}); fp16/fp8/fp8-flat time encode + sum + decode")
    p.add_argument("--repeats", type=int, help=f"timed repetitions per point (default {d.repeats})")
    p.add_argument("--warmup", type=int, help=f"untimed repetitions first (default {d.warmup})")
    p.add_argument("--dtype", help=f"element type (default {d.dtype})")

    p = kinds.add_parser("train", help="iteration time of each exchange mode against DDP, side by side",
                         argument_default=argparse.SUPPRESS)
    t = TrainBenchConfig()
    _add_runtime(p, t.workers)
    p.add_argument("--model", help=f"{' | '.join(MODEL_CHOICES)} (default {t.model})")
    p.add_argument("--image-size", type=int, help=f"synthetic input side (default {t.image_size})")
    p.add_argument("--channels", type=int, help=f"input channels (default {t.channels})")
    p.add_argument("--classes", type=int, help=f"(default {t.classes})")
    p.add_argument("--batch-size", type=int, help=f"global minibatch (default {t.batch_size})")
    p.add_argument("--modes", type=_words, help="comma-separated: none (no exchange: the compute-only bound), "
                   "ddp, ddp-fp16, ddp-bf16, ddp-powersgd, scalesgd-CODEC-ALGORITHM-BUCKETS "
                   f"(default {','.join(t.modes)})")
    p.add_argument("--warmup", type=int, help=f"untimed iterations per mode first (default {t.warmup})")
    p.add_argument("--iterations", type=int, help=f"timed iterations per mode (default {t.iterations})")
    p.add_argument("--rounds", type=int, help=f"modes take turns this many times (default {t.rounds})")

    p = kinds.add_parser("codec", help="fp8 kernel throughput, fused (torch.compile) against eager, one process",
                         argument_default=argparse.SUPPRESS)
    c = CodecBenchConfig()
    p.add_argument("--sizes", type=_sizes, help=f"element counts (default {','.join(map(str, c.sizes))})")
    p.add_argument("--paths", type=_words, help=f"compiled and/or eager (default {','.join(c.paths)})")
    p.add_argument("--repeats", type=int, help=f"timed calls per point (default {c.repeats})")
    p.add_argument("--warmup", type=int, help=f"untimed calls first (default {c.warmup})")
    p.add_argument("--threads", type=int, help=f"compute threads (default {c.threads})")
    p.add_argument("--out", help="output directory (default runs/bench/codec-<timestamp>)")

    p = kinds.add_parser("optimizer", help="time of one optimizer step(), LARS against torch's SGD, one process",
                         argument_default=argparse.SUPPRESS)
    o = OptimizerBenchConfig()
    p.add_argument("--model", help=f"{' | '.join(MODEL_CHOICES)} (default {o.model})")
    p.add_argument("--optimizers", type=_words, help=f"comma-separated from {', '.join(BENCH_OPTIMIZERS)}, "
                   f"with sgd, the reference (default {','.join(o.optimizers)})")
    p.add_argument("--repeats", type=int, help=f"timed steps per optimizer (default {o.repeats})")
    p.add_argument("--warmup", type=int, help=f"untimed steps first (default {o.warmup})")
    p.add_argument("--threads", type=int, help=f"compute threads (default {o.threads})")
    p.add_argument("--weight-decay", type=float, help=f"of the decayed group; never BN γ/β "
                   f"(default {o.weight_decay:g})")
    p.add_argument("--out", help="output directory (default runs/bench/optimizer-<timestamp>)")

    p = kinds.add_parser("accuracy", help="final test accuracy of training variants, median over seeds",
                         argument_default=argparse.SUPPRESS,
                         description="Run `scalesgd train` for every variant × seed, one after another; "
                         "options after -- go to every run. Finished runs are kept and cut-short runs "
                         "resumed when the same command runs again.")
    a = AccuracyBenchConfig()
    p.add_argument("--variants", type=lambda t: tuple(v.strip() for v in t.split(";") if v.strip()),
                   help="';'-separated train options per variant, e.g. '--codec fp32;--codec fp8' "
                   "(the first is the reference)")
    p.add_argument("--seeds", type=_ints, help=f"(default {','.join(map(str, a.seeds))})")
    _add_study(p, "runs/bench/accuracy-<timestamp>")

    p = kinds.add_parser("link", help="throughput and round trip between node 0 and node 1 (run it in the testbed)",
                         argument_default=argparse.SUPPRESS)
    k = LinkBenchConfig()
    _add_runtime(p, k.workers)
    p.add_argument("--megabytes", type=int, help=f"payload per transfer (default {k.megabytes})")
    p.add_argument("--repeats", type=int, help=f"timed transfers (default {k.repeats})")


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="final error against global minibatch per scaling rule and warmup",
                       argument_default=argparse.SUPPRESS,
                       description="Train every batch × rule × warmup (× optimizer × schedule) × seed with "
                       "`scalesgd train`, one after another; options after -- go to every run. Finished runs "
                       "are kept and a cut-short run resumed when the same command runs again.")
    d = SweepConfig()
    p.add_argument("--batches", type=_ints, help=f"global minibatch sizes (default {','.join(map(str, d.batches))})")
    p.add_argument("--rules", type=_words, help=f"scaling rules from {', '.join(SCALING_RULES)} (default linear)")
    p.add_argument("--warmups", type=_words, help=f"from {', '.join(WARMUPS)} (default gradual)")
    p.add_argument("--optimizers", type=_words, help=f"from {', '.join(OPTIMIZER_CHOICES)} (default: as the "
                   "train options say)")
    p.add_argument("--schedules", type=_words, help=f"from {', '.join(SCHEDULES)} (default: as the train options say)")
    p.add_argument("--seeds", type=_ints, help="(default 0)")
    _add_study(p, "runs/sweep-<timestamp>")


def sweep_command(given: dict, argv: list[str]) -> int:
    """`scalesgd sweep`: validate every point, then train them in turn in this process's children."""
    import time

    from scalesgd.train import sweep

    _train_args(given)
    cfg = SweepConfig(**given).validate()
    cfg.out = cfg.out or f"runs/sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    return sweep.run(cfg, "scalesgd " + " ".join(argv))


def _add_testbed(sub) -> None:
    tb = sub.add_parser("testbed", help="a cluster of network namespaces with shaped links on this machine (root)")
    verbs = tb.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    p = verbs.add_parser("up", help="create (or keep) the testbed")
    p.add_argument("--nodes", type=int, default=2, help="nodes (network namespaces), default 2")
    p.add_argument("--procs-per-node", type=int, default=1, help="worker processes per node, default 1")
    p.add_argument("--bandwidth", default="1gbit", help="each node's link rate, both ways (default 1gbit)")
    p.add_argument("--latency", default="0", help="one-way delay added to each node's uplink, needs netem "
                   "(default 0)")
    for name in ("up", "down", "status", "run"):
        q = p if name == "up" else verbs.add_parser(name, help={"down": "remove the testbed",
                                                                  "status": "show the testbed",
                                                                  "run": "run a command's workers in the nodes"}[name])
        q.add_argument("--prefix", default="ssgd", help="names of everything created start with this (default ssgd)")
        if name == "run":
            q.add_argument("--timeout", type=float, default=300.0, help="seconds the others get after a failure")
            q.add_argument("to_run", nargs=argparse.REMAINDER, help="-- then the command, e.g. scalesgd bench link")


def testbed_command(args: dict) -> int:
    """`scalesgd testbed up|down|status|run`."""
    import json

    from scalesgd import testbed

    try:
        if args["verb"] == "up":
            spec = testbed.TestbedSpec(args["nodes"], args["procs_per_node"], args["bandwidth"], args["latency"],
                                       args["prefix"]).validate()
            testbed.up(spec)
            print(f"testbed {spec.prefix}: {spec.nodes} nodes × {spec.procs_per_node} processes, "
                  f"{spec.bandwidth} links, {spec.latency} added latency, node 0 at {spec.address(0)}")
            return 0
        if args["verb"] == "down":
            removed = testbed.down(args["prefix"])
            print(f"removed {len(removed)} namespaces" + (f": {', '.join(removed)}" if removed else ""))
            return 0
        if args["verb"] == "status":
            print(json.dumps(testbed.status(args["prefix"]) or {"up": False}, indent=2))
            return 0
        command = args["to_run"][1:] if args["to_run"][:1] == ["--"] else args["to_run"]
        return testbed.run(args["prefix"], command, args["timeout"])
    except (ValueError, testbed.TestbedError) as err:
        raise UsageError(str(err)) from None


BENCH_CONFIGS = {"allreduce": AllreduceBenchConfig, "train": TrainBenchConfig, "link": LinkBenchConfig,
                 "codec": CodecBenchConfig, "accuracy": AccuracyBenchConfig, "optimizer": OptimizerBenchConfig}
IN_PROCESS = ("codec", "accuracy", "optimizer")  # run in this process (accuracy starts its own training runs)


def bench_command(kind: str, given: dict, argv: list[str]) -> int:
    """`scalesgd bench KIND`: validate, then spawn workers that re-run this command, or join torchrun."""
    import importlib
    import os
    import time

    from scalesgd import launcher
    from scalesgd.train import distributed

    if "train_args" in given:
        _train_args(given)
    cfg = BENCH_CONFIGS[kind](**given).validate()
    command = "scalesgd " + " ".join(argv)
    run = importlib.import_module(f"scalesgd.bench.{kind}").run
    if kind in IN_PROCESS:
        cfg.out = cfg.out or f"runs/bench/{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
        return run(cfg, command)
    if distributed.launched_by_torchrun():
        cfg.workers = int(os.environ["WORLD_SIZE"])
        cfg.out = cfg.out or f"runs/bench/{kind}-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
        return run(cfg, command)
    if not cfg.out:  # every worker must write to the directory the parent chose
        cfg.out = f"runs/bench/{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
        argv = [*argv, "--out", cfg.out]
    return launcher.spawn(["-m", "scalesgd", *argv], cfg.workers, cfg.master_addr, cfg.master_port, cfg.timeout)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="scalesgd", description="Large-minibatch, communication-efficient data-parallel "
                     "training on PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    _add_plan(sub)
    _add_profile(sub)
    _add_bench(sub)
    _add_sweep(sub)
    _add_testbed(sub)
    return parser


def train_config(argv: list[str]) -> TrainConfig:
    """The validated TrainConfig that `scalesgd train ARGV` would run (UsageError otherwise)."""
    args = vars(build_parser().parse_args(["train", *argv]))
    args.pop("command")
    if "resume" in args:
        raise UsageError("--resume cannot be combined here")
    return TrainConfig.from_dict(args).validate()


def train_command(given: dict) -> int:
    """`scalesgd train`: validate, then spawn workers or join a torchrun launch."""
    from scalesgd.train import distributed, launch, worker

    resume_dir = given.pop("resume", None)
    torchrun = distributed.launched_by_torchrun()
    if torchrun:
        import os

        world = int(os.environ["WORLD_SIZE"])
        if given.get("workers", world) != world:
            raise UsageError(f"--workers {given['workers']} contradicts the launch's WORLD_SIZE {world}")
        given["workers"] = world
    if resume_dir is not None:
        cfg = launch.resume_config(resume_dir, given).validate()
    else:
        cfg = TrainConfig.from_dict(given).validate()
    if torchrun:
        return worker.run(cfg, resume_dir, resume=resume_dir is not None)
    if resume_dir is not None:
        launch.write_config(cfg, resume_dir)
        return launch.spawn_train(cfg, resume_dir, resume=True)
    return launch.spawn_train(cfg, launch.prepare_new_run(cfg), resume=False)


def main(argv: list[str] | None = None) -> int:
    """Run a command; a process that joined a distributed launch ends without interpreter teardown."""
    from scalesgd.train import distributed

    code = _run(argv)
    if distributed.launched_by_torchrun() and argv is None:
        distributed.exit_process(code)
    return code


def _run(argv: list[str] | None) -> int:
    try:
        args = vars(build_parser().parse_args(argv))
        command = args.pop("command")
        if command == "train":
            return train_command(args)
        if command == "plan":
            return plan_command(args)
        if command == "profile":
            return profile_command(args)
        if command == "testbed":
            return testbed_command(args)
        if command == "sweep":
            return sweep_command(args, list(sys.argv[1:] if argv is None else argv))
        if command == "bench":
            return bench_command(args.pop("bench"), args, list(sys.argv[1:] if argv is None else argv))
        raise UsageError(f"unknown command {command!r}")
    except UsageError as err:
        print(f"scalesgd: error: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
