"""`scalesgd sweep`: where a model's minibatch limit lies, per scaling rule and warmup (Goyal et al. Figs 1–3).

Every point of the grid is one ordinary `scalesgd train` run in `OUT/runs/`, trained in turn; a second
call skips finished points and resumes the one that was cut short. The report is the final test error
against the global minibatch, one line per recipe, with each recipe's limit (the largest batch within
LIMIT_POINTS of its smallest batch) beside the gradient noise scale measured at the smallest batch, which
predicts it (McCandlish et al. 2018), as its average over each run and its median over each run's epochs; and
the training curves of each size against the smallest.
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from scalesgd import output
from scalesgd.checks import all_of, distinct, each, each_once, output_dir, positive, seed
from scalesgd.config import TrainConfig
from scalesgd.errors import UsageError, option_name
from scalesgd.optim import OPTIMIZERS
from scalesgd.options import Options, floats_of, ints, option, words
from scalesgd.recipe.scaling import SCALING_RULES
from scalesgd.recipe.schedule import SCHEDULES, WARMUPS
from scalesgd.train.metrics import read
from scalesgd.train.rundir import METRICS_NAME, SUMMARY_NAME
from scalesgd.train.study import failed, train_once

SETS = ("batch_size", "lr_scaling", "warmup", "seed", "run_dir", "resume")  # train options every point sets
LIMIT_POINTS = 1.0  # a batch is within the limit while its error is at most this many points above the smallest's
LIMIT_LOSS = 0.01  # a language model's: while its validation loss is at most this fraction above the smallest's


@dataclass
class SweepConfig(Options):
    """`scalesgd sweep`: final error against global minibatch for each scaling rule and warmup (Goyal et al. 2017's figure of error against minibatch)."""

    batches: tuple[int, ...] = option((32, 64, 128, 256, 512, 1024), "global minibatch sizes", parse=ints,
                                      check=lambda v: distinct(v) or (None if min(v) >= 1 else "give sizes >= 1"))
    rules: tuple[str, ...] = option(("linear",), "scaling rules", choices=SCALING_RULES, parse=words, check=distinct)
    warmups: tuple[str, ...] = option(("gradual",), "warmups to try", choices=WARMUPS, parse=words,
                                      check=distinct)
    optimizers: tuple[str, ...] = option((), "optimizers to try", choices=OPTIMIZERS, parse=words,
                                         check=each_once,
                                         shown_default="as the train options say")
    schedules: tuple[str, ...] = option((), "decay schedules to try", choices=SCHEDULES, parse=words,
                                        check=each_once,
                                        shown_default="as the train options say")
    seeds: tuple[int, ...] = option((0,), "each point trains once per seed", parse=ints,
                                    check=all_of(distinct, each(seed)))
    base_lrs: tuple[float, ...] = option((), "base rates to try, each recipe once per rate (a short search for "
                                         "the rate each recipe wants)", parse=floats_of("rates"),
                                         check=all_of(each_once, each(positive)),
                                         shown_default="as the train options say")
    out: str = option("", "output directory", shown_default="runs/sweep-<timestamp>", check=output_dir)
    train_args: tuple[str, ...] = option((), "-- then options for every run", remainder=True)

    def validate(self) -> SweepConfig:
        """Every option, then every point as the train options it runs with, before any run starts."""
        super().validate()
        owned = [*SETS, *(["optimizer"] if self.optimizers else []), *(["schedule"] if self.schedules else []),
                 *(["base_lr"] if self.base_lrs else [])]
        given = [name for name in owned if option_name(name) in self.train_args]
        if given:
            raise UsageError(f"{', '.join(f'`{name}`' for name in given)} after --: the sweep sets it for each run")
        for point in grid(self):
            try:
                TrainConfig.from_argv(point.argv(self.train_args))
            except UsageError as err:
                raise UsageError(f"{point.label}: {err}") from None
        return self


@dataclass(frozen=True)
class Point:
    """One run of the grid."""

    batch: int
    rule: str
    warmup: str
    optimizer: str | None
    schedule: str | None
    seed: int
    base_lr: float | None = None
    noise: bool = False  # measure the gradient noise scale (2+ workers)

    @property
    def recipe(self) -> str:
        """Everything but the batch and seed: the line this point belongs to."""
        return " · ".join(p for p in (self.family, f"η₀ {self.base_lr:g}" if self.base_lr else None) if p)

    @property
    def family(self) -> str:
        """The recipe but its base rate: the points a rate search compares."""
        parts = [_phrase(self.rule, "scaling"), _phrase(self.warmup, "warmup"), self.optimizer, self.schedule]
        return " · ".join(p for p in parts if p)

    @property
    def label(self) -> str:
        return f"batch {self.batch} · {self.recipe} · seed {self.seed}"

    @property
    def dirname(self) -> str:
        parts = [f"b{self.batch}", self.rule, self.warmup, self.optimizer, self.schedule,
                 f"lr{self.base_lr:g}" if self.base_lr else None, f"seed{self.seed}"]
        return "-".join(p for p in parts if p)

    def argv(self, train_args: tuple[str, ...]) -> list[str]:
        """The `scalesgd train` options of this point (the shared ones first)."""
        argv = [*train_args, "--batch-size", str(self.batch), "--lr-scaling", self.rule, "--warmup", self.warmup,
                "--seed", str(self.seed)]
        if self.optimizer:
            argv += ["--optimizer", self.optimizer]
        if self.schedule:
            argv += ["--schedule", self.schedule]
        if self.base_lr:
            argv += ["--base-lr", repr(self.base_lr)]
        if self.noise:
            argv += ["--noise-scale"]
        return argv


def _phrase(choice: str, what: str) -> str:
    return f"no {what}" if choice == "none" else f"{choice} {what}"


def grid(cfg: SweepConfig) -> list[Point]:
    """Every point, recipe by recipe, each recipe's batches from the smallest up; with 2+ workers each measures
    the gradient noise scale (AdaScale needs it anyway)."""
    noise = TrainConfig.from_argv(list(cfg.train_args)).runtime.workers >= 2
    return [Point(b, r, w, o, s, seed, lr, noise) for o, s, lr, r, w in itertools.product(
                cfg.optimizers or (None,), cfg.schedules or (None,), cfg.base_lrs or (None,), cfg.rules, cfg.warmups)
            for b in sorted(cfg.batches) for seed in cfg.seeds]


def run_name(point: Point, base_batch: int) -> str:
    """At the base batch every rule and warmup give the same rates, so those points share one run."""
    shared = point.batch == base_batch and point.rule != "adascale"  # AdaScale's schedule runs in its own steps
    return replace(point, rule="linear", warmup="none").dirname if shared else point.dirname


def run(cfg: SweepConfig, command: str) -> int:
    """Train every point in turn, then write the table and plots."""
    out = Path(cfg.out)
    points = grid(cfg)
    base_batch = TrainConfig.from_argv(points[0].argv(cfg.train_args)).recipe.base_batch  # the same for every point
    results = []
    for point in points:
        run_dir = out / "runs" / run_name(point, base_batch)
        code = train_once(point.argv(cfg.train_args), run_dir, point.label)
        if code != 0:
            return failed(point.label, code, run_dir)
        results.append(result_of(point, run_dir))
    report(cfg, results, command)
    return 0


def result_of(point: Point, run_dir: Path) -> dict:
    """A finished point's final and best test error and its per-epoch curves; a language model's "error" is its
    validation loss (nats per token), with its perplexity beside it."""
    summary = json.loads((run_dir / SUMMARY_NAME).read_text())
    text = "final_test_perplexity" in summary
    epochs = [r for r in read(run_dir / METRICS_NAME) if r["kind"] == "epoch"]
    measured = [r["noise_scale"] for r in epochs if r.get("noise_scale") is not None]
    return {"batch": point.batch, "recipe": point.recipe, "family": point.family, "base_lr": point.base_lr,
            "seed": point.seed, "run_dir": str(run_dir),
            # B_simple grows as training converges (|G|² shrinks): the run's median over its epochs, and its
            # training average (the ratio of the run's summed estimates)
            "noise_scale": statistics.median(measured) if measured else None,
            "noise_scale_average": summary.get("noise_scale_average"),
            "peak_lr": summary["peak_lr"], "steps_per_epoch": summary["steps_per_epoch"],
            "epochs_trained": summary.get("epochs_trained", summary["epochs"]),  # AdaScale's may exceed --epochs
            **({"metric": "loss", "final_test_error": summary["final_test_loss"],
                "best_test_error": min(r["test_loss"] for r in epochs),
                "final_test_perplexity": summary["final_test_perplexity"]} if text else
               {"final_test_error": 1 - summary["final_test_acc"], "best_test_error": 1 - summary["best_test_acc"]}),
            "wall_time_s": summary["wall_time_s"],
            "curve": [{"epoch": r["epoch"], "train_error": r["train_loss"] if text else 1 - r["train_acc"],
                       "train_loss": r["train_loss"], "test_error": r["test_loss"] if text else 1 - r["test_acc"]}
                      for r in epochs]}


@dataclass(frozen=True)
class Scale:
    """How a sweep's errors read: test error in per cent (a batch within LIMIT_POINTS points of the smallest is
    within the limit), or a language model's validation loss in nats per token (within LIMIT_LOSS of it)."""

    loss: bool = False

    @classmethod
    def of(cls, results: list[dict]) -> Scale:
        return cls(any(r.get("metric") == "loss" for r in results))

    def shown(self, error: float) -> float:
        return error if self.loss else 100 * error

    def within(self, error: float, smallest: float) -> bool:
        return error - smallest <= (LIMIT_LOSS * smallest if self.loss else LIMIT_POINTS / 100)

    @property
    def name(self) -> str:
        return "validation loss (nats/token)" if self.loss else "test error (%)"

    @property
    def limit_text(self) -> str:
        return f"≤ {100 * LIMIT_LOSS:g} % more loss" if self.loss else f"≤ {LIMIT_POINTS:g} point"


def median_errors(results: list[dict]) -> dict[str, dict[int, float]]:
    """recipe → batch → median final test error over seeds."""
    table: dict[str, dict[int, list[float]]] = {}
    for r in results:
        table.setdefault(r["recipe"], {}).setdefault(r["batch"], []).append(r["final_test_error"])
    return {recipe: {b: statistics.median(v) for b, v in sorted(row.items())} for recipe, row in table.items()}


def best_rates(errors: dict[str, dict[int, float]], results: list[dict]) -> dict[str, dict[int, float]]:
    """family (the recipe but its rate) → batch → the searched base rate whose recipe has the lowest median error
    (`median_errors`; the smaller rate on a tie); empty without a rate search."""
    rated = {r["recipe"]: (r["family"], r["base_lr"]) for r in results if r.get("base_lr") is not None}
    best: dict[str, dict[int, tuple[float, float]]] = {}
    for recipe, (family, lr) in rated.items():
        row = best.setdefault(family, {})
        for batch, error in errors[recipe].items():
            row[batch] = min(row.get(batch, (error, lr)), (error, lr))
    return {family: {b: lr for b, (_, lr) in sorted(row.items())} for family, row in best.items()}


def limits(errors: dict[str, dict[int, float]], scale: Scale = Scale()) -> dict[str, int]:
    """recipe → the largest batch whose median error is within the limit (`Scale.within`) of the recipe's smallest
    batch's."""
    found = {}
    for recipe, row in errors.items():
        smallest = row[min(row)]
        found[recipe] = max(b for b, e in row.items() if scale.within(e, smallest))
    return found


def noise_at_smallest(results: list[dict], key: str = "noise_scale_average") -> dict[str, float | None]:
    """recipe → the median over its smallest-batch runs of each run's B_simple: its training average, or with
    key="noise_scale" its median over its epochs (None where none was measured)."""
    smallest = min(r["batch"] for r in results)
    found: dict[str, list[float]] = {}
    for r in results:
        if r["batch"] == smallest and r.get(key) is not None:
            found.setdefault(r["recipe"], []).append(r[key])
    return {recipe: statistics.median(found[recipe]) if recipe in found else None
            for recipe in dict.fromkeys(r["recipe"] for r in results)}


def report(cfg: SweepConfig, results: list[dict], command: str) -> None:
    """sweep.md/json: error per recipe and batch with its distance to the recipe's smallest batch, the limit and
    the noise scale beside it; the plots."""
    errors, scale = median_errors(results), Scale.of(results)
    batches = sorted(cfg.batches)
    limit, rates = limits(errors, scale), best_rates(errors, results)
    noise, noise_median = noise_at_smallest(results), noise_at_smallest(results, "noise_scale")
    what = "val loss" if scale.loss else "error %"
    columns = ["recipe", *(f"{b} {what} (Δ)" for b in batches), f"limit ({scale.limit_text})",
               f"noise scale at {batches[0]}: run average", "median of epochs"]
    rows = []
    digits = 4 if scale.loss else 2
    for recipe, row in errors.items():
        first = row[batches[0]]
        rows.append([recipe, *(f"{scale.shown(row[b]):.{digits}f} ({scale.shown(row[b] - first):+.{digits}f})"
                               for b in batches), limit[recipe],
                     *(f"{n[recipe]:.0f}" if n.get(recipe) is not None else "—" for n in (noise, noise_median))])
    out = Path(cfg.out)
    output.write(out, "sweep", {"config": cfg.to_dict(), "median_final_test_error": {
        recipe: {str(b): e for b, e in row.items()} for recipe, row in errors.items()}, "limit": limit,
        "noise_scale_average_at_smallest": noise, "noise_scale_at_smallest": noise_median,
        "best_base_lr": {family: {str(b): lr for b, lr in row.items()} for family, row in rates.items()},
        "results": results}, columns, rows, command)
    plot_error(out / "sweep.png", errors, len(cfg.seeds), limit, noise, noise_median, scale)
    plot_curves(out / "curves.png", results, batches, scale)
    output.console().print(output.rich_table(f"final {scale.name} against global minibatch (median of "
                                             f"{len(cfg.seeds)} seed(s); Δ: vs the smallest batch)", columns, rows))
    for family, row in rates.items():
        output.console().print(f"best base rate, {family}: " + ", ".join(f"{lr:g} at {b}" for b, lr in row.items()),
                               highlight=False)
    output.console().print(f"written to {out}/sweep.{{json,md,png}} and curves.png", highlight=False)


def plot_error(path: Path, errors: dict[str, dict[int, float]], seeds: int, limit: dict[str, int] | None = None,
               noise: dict[str, float | None] | None = None,
               noise_median: dict[str, float | None] | None = None, scale: Scale = Scale()) -> None:
    """Final test error against global minibatch, one line per recipe (Goyal et al. Figure 1); each recipe's limit
    starred, the noise scale measured at the smallest batch a vertical line of the same colour: its run average
    dash-dotted, its median over epochs dotted."""
    plt = output.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (recipe, row) in enumerate(errors.items()):
        ax.plot(list(row), [scale.shown(e) for e in row.values()], "o-", color=f"C{i}", label=recipe)
        if limit:
            ax.plot([limit[recipe]], [scale.shown(row[limit[recipe]])], "*", ms=14, color=f"C{i}", mec="k")
        for values, style in ((noise, "-."), (noise_median, ":")):
            if values and values.get(recipe):
                ax.axvline(values[recipe], color=f"C{i}", ls=style, lw=1.2)
    if limit or noise or noise_median:
        ax.set_title(f"★ largest batch within the limit ({scale.limit_text}) of the smallest\nnoise scale "
                     "B_simple at the "
                     "smallest: -· its run average, ⋮ its median over epochs", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({b for row in errors.values() for b in row}))
    ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("global minibatch kn")
    ax.set_ylabel(f"final {scale.name}, median of {seeds}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(path: Path, results: list[dict], batches: list[int], scale: Scale = Scale()) -> None:
    """Training error per epoch of each larger batch against the smallest (Goyal et al. Figures 2–3)."""
    plt = output.pyplot()
    larger = batches[1:] or batches
    cols = min(3, len(larger))
    rows = -(-len(larger) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False, sharey=True)
    recipes = list(dict.fromkeys(r["recipe"] for r in results))
    colours = {recipe: f"C{i}" for i, recipe in enumerate(recipes)}
    for ax, batch in zip(axes.flat, larger):
        for r in results:
            if r["seed"] != results[0]["seed"] or r["batch"] not in (batches[0], batch):
                continue
            small = r["batch"] == batches[0]
            if small and r["recipe"] != recipes[0]:
                continue  # one reference curve: the smallest batch of the first recipe
            curve = r["curve"]
            style = {"color": "k", "linestyle": "--"} if small else {"color": colours[r["recipe"]]}
            ax.plot([c["epoch"] for c in curve], [scale.shown(c["train_error"]) for c in curve], **style,
                    label=f"kn={batches[0]} (reference)" if small else r["recipe"])
        ax.set_title(f"kn = {batch} against kn = {batches[0]}")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("training loss (nats/token)" if scale.loss else "training error (%)")
    for ax in list(axes.flat)[len(larger):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

