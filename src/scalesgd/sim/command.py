"""`scalesgd simulate`: iteration time, exposed exchange, images/s and scaling efficiency on any cluster,
per mode and worker count; `--validate` checks the model against a `bench train` run; `--preset` the papers' (Goyal et al. 2017, Oyama et al. 2020, Honda et al.)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from scalesgd import checks, output
from scalesgd.comm.cost.link import LinkCost
from scalesgd.comm.cost.profile import fit_line
from scalesgd.data.text import VOCAB_SIZE
from scalesgd.errors import UsageError
from scalesgd.models import MODEL_OPTIONS, MODELS, TEXT, ModelOptions
from scalesgd.options import Options, expanded, field_default, ints, option, record, refuse, words
from scalesgd.sim import compute, presets, quality, scaling
from scalesgd.sim.calibrate import BenchRecord, Calibration, NotABenchDir, validate_against
from scalesgd.sim.exchange import Costs, check_modelled
from scalesgd.sim.failures import Failures
from scalesgd.sim.modes import SHARDED, parse_mode
from scalesgd.sim.network import Cluster
from scalesgd.units import RATE, mbit_s, seconds

DEFAULT_MODES = ("ddp", "ddp-fp16", "scalesgd-fp16", "scalesgd-fp8", "scalesgd-topk@0.01")

def _latency(text: str) -> str | None:
    try:
        value = seconds(text)
    except ValueError:
        return "use a time such as 5us, 0.2ms or 0"
    return None if value >= 0 and value == value and value != float("inf") else "must be a finite time ≥ 0"


def _rate(text: str) -> str | None:
    if not RATE.match(text):
        return "use a rate such as 100mbit, 25gbit or 12.5gbps (bytes)"
    return None if mbit_s(text) > 0 else "must be above 0"


@dataclass
class SimulateConfig(Options):
    """`scalesgd simulate`: a compute profile, a cluster and exchange modes in; predicted iterations out."""

    profile: str = option("", "a `bench train` output directory or a `train --planner` run directory: the "
                          "per-layer compute measured there (and, from a bench directory, each mode's costs)")
    model: str = option("", "instead of --profile: a model whose --iteration-time on some device is known; "
                        "per-layer times split by FLOPs (gpt: on --batch-per-worker sequences of --gpt-block "
                        "tokens over the 256 byte values)", choices=lambda: ("", *MODELS))
    iteration_time: float = option(0.0, "with --model: seconds of one worker's forward + backward + step",
                                   check=checks.finite_non_negative)
    batch_per_worker: int = option(32, "with --model: samples per worker per micro-batch", check=checks.positive)
    accumulate: int = option(1, "with --model: micro-batches per step (the ones before the last compute with "
                             "nothing to exchange; --iteration-time is one micro-batch's and the step)",
                             check=checks.at_least(1))
    optimizer: str = option("", "with --model: the inner optimizer whose measured steps to the target turn a "
                            "predicted step into a time to it (muon: its rows of the shipped table)",
                            shown_default="the model's own")
    image_size: int = option(224, "with --model: input side", check=checks.positive)
    classes: int = option(1000, "with --model: classifier outputs", check=checks.at_least(2, "classes"))
    model_options: ModelOptions = expanded(MODEL_OPTIONS.items, ModelOptions, lambda held, family: held[family],
                                           group="model options: {}")  # with --model gpt: its size, --gpt-layers …
    calibration: str = option("", "`bench train` directories (comma-separated: their mean) whose measured compute, "
                              "codec costs and compute displacement apply (default: the --profile directory if it is "
                              "one; none otherwise)")
    workers: tuple[int, ...] = option((8, 16, 32, 64, 128, 256), "worker counts, each a multiple of "
                                      "--procs-per-node", parse=ints, check=checks.distinct)
    procs_per_node: int = option(8, "workers per node", check=checks.positive)
    inter_bandwidth: str = option("10gbit", "each node's link to the others (tc units: 25gbit, 12.5gbps)",
                                  check=_rate)
    inter_latency: str = option("5us", "a message's fixed cost between nodes", check=_latency)
    intra_bandwidth: str = option("100gbit", "between processes of a node", check=_rate)
    intra_latency: str = option("2us", "a message's fixed cost inside a node", check=_latency)
    link: str = option("", "take α and β from a `bench train` (its fastest rate), `bench allreduce` (fitted to "
                       "the ring's times) or `bench link` output directory instead")
    modes: tuple[str, ...] = option(DEFAULT_MODES, "exchange modes as `bench train` names them; the first is "
                                    "the baseline of the bandwidth plot", parse=words, check=checks.distinct)
    fsdp_backend: str = option("nccl", "how the sharded modes' collectives run: nccl (beside compute: FSDP2 gathers "
                               "a unit ahead and sums behind backward) or gloo (each in the thread that issued it; "
                               "FSDP2's own reduce-scatter sends an allreduce's bytes)", choices=("nccl", "gloo"))
    preset: str = option("", "a paper's cluster, model and published parameters (see docs/SIMULATE.md)",
                         choices=lambda: ("", *presets.PRESETS))
    cluster: str = option("", "with --model or --profile: a paper's cluster (its workers per node and links, as "
                          "--preset has them) in place of --procs-per-node, --inter-* and --intra-*",
                          choices=lambda: ("", *presets.PRESETS))
    validate_dir: str = option("", "predict every mode of this `bench train` directory from its links and the "
                           "--calibration directory's compute and costs; print the errors", flag="--validate")
    mtbf_hours: float = option(0.0, "a worker's mean time between failures, hours (0: none): each row's time to the "
                               "target with failures, elastic rounds for the periodic modes, a restart of every "
                               "worker from the last checkpoint for the others", check=checks.within(0, 1e6))
    restart_seconds: float = option(10.2, "with --mtbf-hours: seconds a restarted worker takes to train again",
                                    check=checks.within(0, 1e6))
    checkpoint_seconds: float = option(600.0, "with --mtbf-hours: seconds of training between checkpoints (a "
                                       "restart of every worker trains half of it again)",
                                       check=checks.within(0, 1e9))
    json: bool = option(False, "print the results as JSON")
    out: str = option("", "write simulate.{json,md,png} (validate.{json,md} with --validate) here",
                      shown_default="runs/simulate-<timestamp>", check=checks.output_dir)

    def validate(self) -> SimulateConfig:
        super().validate()
        sources = [bool(self.profile), bool(self.model), bool(self.preset), bool(self.validate_dir)]
        if sum(sources) != 1:
            raise UsageError("give exactly one of `profile`, `model` (with `iteration_time`), `preset` or "
                             "`validate`")
        refuse("gpt_width", self.model_options["gpt"].width, self.model_options["gpt"].problem())
        if self.cluster:
            self._take_the_paper_s_cluster()
        if self.model and self.iteration_time <= 0:
            raise UsageError(f"`iteration_time` {self.iteration_time}: with `model` give the seconds one worker's "
                             "iteration takes on the device (> 0)")
        if self.optimizer:
            family = quality.family_of(bool(self.model) and MODELS[self.model].data == TEXT)
            measured = quality.other_optimizers(family)
            if not self.model or self.optimizer not in measured:
                raise UsageError(f"`optimizer` {self.optimizer}: with `model`, one whose steps to the target were "
                                 f"measured for it: {', '.join(measured) or 'none'}")
        for count in self.workers:
            if count < 1 or count % self.procs_per_node:
                raise UsageError(f"`workers` {count}: every count must be a positive multiple of `procs_per_node` "
                                 f"{self.procs_per_node}")
        for name in self.modes:
            try:
                mode = parse_mode(name)
                check_modelled(mode)
            except (ValueError, KeyError) as err:
                raise UsageError(f"`modes` {name}: {err}") from None
            if mode.engine in SHARDED and not self.model:
                raise UsageError(f"`modes` {name}: a sharded mode is costed unit by unit (a GPT's blocks, a ResNet's "
                                 "stages); give `model` with `iteration_time`")
        for name, flag in (("profile", "profile"), ("calibration", "calibration"), ("link", "link"),
                           ("validate_dir", "validate")):
            for path in getattr(self, name).split(",") if getattr(self, name) else ():
                if not Path(path).is_dir():
                    raise UsageError(f"`{flag}` {path}: not a directory")
        return self

    def _take_the_paper_s_cluster(self) -> None:
        """A paper's cluster replaces the described one: a described link beside it would be silently ignored."""
        if self.preset or self.link or self.validate_dir:
            raise UsageError(f"`cluster` {self.cluster}: give it with `model` or `profile`, not with `preset`, "
                             "`link` or `validate` (they bring their own links)")
        for name in ("procs_per_node", "inter_bandwidth", "inter_latency", "intra_bandwidth", "intra_latency"):
            if getattr(self, name) != field_default(SimulateConfig, name):
                raise UsageError(f"`{name}` {getattr(self, name)}: `cluster` {self.cluster} brings its own; give "
                                 "one or the other")
        self.procs_per_node = presets.PRESETS[self.cluster].cluster().procs_per_node


def run(cfg: SimulateConfig, command: str) -> int:
    cfg.out = cfg.out or f"runs/simulate-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        if cfg.validate_dir:
            return _validate(cfg, command)
        if cfg.preset:
            preset = presets.PRESETS[cfg.preset]
            profile, cluster, modes, costs = preset.profile(), preset.cluster(), preset.modes, preset.costs()
            workers = list(preset.workers)
        else:
            profile, costs = _profile_and_costs(cfg)
            cluster, modes, workers = _cluster(cfg), list(cfg.modes), list(cfg.workers)
    except NotABenchDir as err:
        raise UsageError(str(err)) from None
    parsed = [parse_mode(m) for m in modes]
    for mode in parsed:
        problem = mode.schedule.fits(profile.layers) if mode.schedule is not None else None
        if problem:
            raise UsageError(f"`modes` {mode.name}: {problem}")
    costs = {**costs, **{m.name: replace(costs.get(m.name, Costs()), fsdp_backend=cfg.fsdp_backend) for m in parsed
                         if m.engine in SHARDED}}
    table = scaling.rows(profile, cluster, parsed, workers, costs)
    measured = quality.table(quality.family_of(MODELS[cfg.model].data == TEXT),
                             optimizer=cfg.optimizer) if cfg.model else {}
    failures = Failures(cfg.mtbf_hours * 3600, cfg.restart_seconds, cfg.checkpoint_seconds) if cfg.mtbf_hours else None
    for row, mode in zip(table, [m for _ in workers for m in parsed]):
        steps = measured.get(quality.mode_key(mode))
        steps = steps and steps.at(row["workers"])  # measured at this M, or the power law in M fitted
        row.update(steps_factor=steps and steps.factor, steps_basis=steps and steps.basis,
                   missed=bool(steps and steps.missed),
                   to_target_s=quality.to_target(row["iteration_s"], steps))
        if failures is not None:
            round_s = row["iteration_s"] * mode.schedule.local_steps if mode.schedule is not None else None
            cost = failures.per_failure_s(row["workers"], round_s)
            row.update(failure_cost_s=cost,
                       to_target_with_failures_s=failures.stretched(row["to_target_s"], row["workers"], cost))
    top = cluster.with_nodes(max(workers) // cluster.procs_per_node)
    sweep = scaling.bandwidth_sweep(profile, top, parsed, costs, top.inter.bytes_per_s / 100,
                                    top.inter.bytes_per_s * 10)
    result = {"rows": table, "bandwidth": sweep, "cluster": _describe(cluster),
              "compute": {"iteration_s": profile.iteration_s, "batch_per_worker": profile.batch_per_worker,
                          "accumulate": profile.accumulate,
                          "parameters": profile.numel},
              "costs": {m: c.to_dict() for m, c in costs.items()}}
    if cfg.preset:
        result["headline"] = presets.PRESETS[cfg.preset].headline(table)
    _emit(cfg, result, command, _rows_table(table), "simulate", lambda path: _plot(path, table, sweep, top))
    return 0


def _profile_and_costs(cfg: SimulateConfig):
    if cfg.model:
        text = MODELS[cfg.model].data == TEXT  # a language model: over the byte values, as `train` has it
        profile = compute.from_flops(cfg.model, cfg.iteration_time, cfg.batch_per_worker, cfg.image_size,
                                     VOCAB_SIZE if text else cfg.classes, options=cfg.model_options)
        profile = replace(profile, accumulate=cfg.accumulate)
        source = cfg.calibration
    elif (Path(cfg.profile) / "train.json").is_file():
        profile = None
        source = cfg.calibration or cfg.profile
    elif (Path(cfg.profile) / "profile.json").is_file():
        profile = compute.from_run_dir(Path(cfg.profile))
        source = cfg.calibration
    else:
        raise UsageError(f"`profile` {cfg.profile}: holds neither a `bench train` train.json nor a "
                         "`train --planner` profile.json")
    if not source:
        return profile, {}
    calibration = Calibration.pooled([BenchRecord.load(d) for d in source.split(",")], list(cfg.modes))
    return profile or calibration.profile, calibration.costs


def _cluster(cfg: SimulateConfig) -> Cluster:
    nodes = max(1, cfg.workers[0] // cfg.procs_per_node)
    if cfg.cluster:
        return presets.PRESETS[cfg.cluster].cluster().with_nodes(nodes)
    if cfg.link:
        inter, intra = _measured_links(Path(cfg.link))
        return Cluster(nodes, cfg.procs_per_node, inter, intra)
    return Cluster(nodes, cfg.procs_per_node,
                   LinkCost(seconds(cfg.inter_latency), mbit_s(cfg.inter_bandwidth) * 1e6 / 8),
                   LinkCost(seconds(cfg.intra_latency), mbit_s(cfg.intra_bandwidth) * 1e6 / 8))


def _measured_links(directory: Path) -> tuple[LinkCost, LinkCost]:
    """α and β from a `bench train` record (its fastest rate) or a `bench link` record."""
    if (directory / "train.json").is_file():
        bench = BenchRecord.load(directory)
        fastest = max(bench.rates, key=lambda rate: bench.cluster(rate).inter.bytes_per_s)
        cluster = bench.cluster(fastest)
        return cluster.inter, cluster.intra
    try:
        if (directory / "allreduce.json").is_file():
            link = _ring_fit(json.loads((directory / "allreduce.json").read_text()))
        else:
            result = json.loads((directory / "link.json").read_text())["result"]
            link = LinkCost(result["rtt_ms"] / 2e3, result["duplex_mbit_s_each_way"] * 1e6 / 8)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        raise UsageError(f"`link` {directory}: holds no `bench train` train.json, `bench allreduce` allreduce.json "
                         "(with ring at two sizes or more) or `bench link` link.json") from None
    return link, link


def _ring_fit(record: dict) -> LinkCost:
    """α and β from our ring's times at several sizes: t = 2(p−1)·α + 2(p−1)/p · bytes / rate."""
    p = record["world_size"]
    rows = [r for r in record["results"] if r["algorithm"] == "ring"]
    if len({r["bytes"] for r in rows}) < 2:
        raise ValueError("a fit needs two sizes")
    intercept, slope = fit_line([r["bytes"] for r in rows], [r["median_s"] for r in rows])
    return LinkCost(intercept / (2 * (p - 1)), 2 * (p - 1) / p / slope)


def _validate(cfg: SimulateConfig, command: str) -> int:
    bench = BenchRecord.load(cfg.validate_dir)
    calibration = Calibration.pooled([BenchRecord.load(d) for d in (cfg.calibration or cfg.validate_dir).split(",")])
    points = validate_against(bench, calibration)
    errors = [abs(p["error"]) for p in points]
    result = {"points": points, "bench": cfg.validate_dir, "calibration": (cfg.calibration or cfg.validate_dir).split(","),
              "median_abs_error": statistics.median(errors) if errors else None,
              "max_abs_error": max(errors) if errors else None}
    rows = [[p["bandwidth"] or "as is", p["mode"], f"{1e3 * p['measured_s']:.1f}", f"{1e3 * p['predicted_s']:.1f}",
             f"{100 * p['error']:+.1f} %"] for p in points]
    _emit(cfg, result, command, (["link", "mode", "measured ms", "predicted ms", "error"], rows), "validate", None)
    return 0


def _emit(cfg: SimulateConfig, result: dict, command: str, table: tuple[list[str], list[list]], name: str,
          draw) -> None:
    columns, rows = table
    output.write(Path(cfg.out), name, {"config": record(cfg), **result}, columns, rows, command)
    if draw is not None:
        draw(Path(cfg.out) / f"{name}.png")
    if cfg.json:
        print(json.dumps(result, indent=1))
        return
    console = output.console()
    console.print(output.rich_table(name, columns, rows))
    for key in ("headline", "median_abs_error", "max_abs_error"):
        if result.get(key) is not None:
            console.print(f"{key}: {result[key]}", highlight=False)
    console.print(f"written to {cfg.out}/{name}.{{json,md{',png' if draw else ''}}}", highlight=False)


def _rows_table(table: list[dict]) -> tuple[list[str], list[list]]:
    failing = any("failure_cost_s" in r for r in table)
    columns = ["workers", "mode", "iteration ms", "exposed ms", "images/s", "efficiency", "steps to target × DDP's",
               "to target: ms per DDP step",
               *(["a failure costs, s", "with failures: ms per DDP step"] if failing else [])]
    ms = lambda value: "—" if value is None else f"{1e3 * value:.1f}"  # noqa: E731
    return columns, [[r["workers"], r["mode"], f"{1e3 * r['iteration_s']:.1f}", f"{1e3 * r['exposed_comm_s']:.1f}",
                      "—" if r["images_per_s"] is None else f"{r['images_per_s']:,.0f}",
                      "—" if r["scaling_efficiency"] is None else f"{100 * r['scaling_efficiency']:.1f} %",
                      "missed" if r.get("missed") else "—" if r.get("steps_factor") is None
                      else f"{r['steps_factor']:.2f}" + ("" if r["steps_basis"] in ("measured", "per step")
                                                        else f" ({r['steps_basis']})"), ms(r.get("to_target_s")),
                      *([f"{r['failure_cost_s']:.1f}", ms(r["to_target_with_failures_s"])] if failing else [])]
                     for r in table]


def _describe(cluster: Cluster) -> dict:
    return {"procs_per_node": cluster.procs_per_node, "inter": cluster.inter.to_dict(),
            "intra": cluster.intra.to_dict()}


def _plot(path: Path, table: list[dict], sweep: dict, top: Cluster) -> None:
    """Throughput and efficiency against workers, and iteration time against the link rate with crossovers."""
    plt = output.pyplot()
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.8))
    for mode in dict.fromkeys(r["mode"] for r in table):
        mine = [r for r in table if r["mode"] == mode]
        a.plot([r["workers"] for r in mine], [r["images_per_s"] or 0 for r in mine], marker="o", label=mode)
        b.plot([r["workers"] for r in mine], [100 * (r["scaling_efficiency"] or 0) for r in mine], marker="o", label=mode)
        gbit = [8 * x / 1e9 for x in sweep["rates_bytes_s"]]
        c.plot(gbit, sweep["iteration_s"][mode], label=mode)
        cross = sweep["crossover_bytes_s"].get(mode)
        if isinstance(cross, float):
            c.axvline(8 * cross / 1e9, linestyle=":", color=c.lines[-1].get_color())
    for ax, title, ylabel in ((a, "throughput", "images/s"), (b, "scaling efficiency", "%"),
                              (c, f"{top.workers} workers: iteration against link rate", "s")):
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2 if ax is not c else 10)
        ax.set_xlabel("workers" if ax is not c else "inter-node Gbit/s (dotted: where a mode stops beating "
                      "the first)")
        ax.grid(alpha=0.3)
    c.set_yscale("log")
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
