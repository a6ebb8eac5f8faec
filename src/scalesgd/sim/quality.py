"""Steps to a model family's target quality per exchange, against DDP fp32's, as `scalesgd bench quality` measured
them (shipped with the package in steps_to_target.json): what turns a predicted step or round time into a predicted
time to the target, and what keeps an exchange that missed the target from being chosen.

An exchange is keyed by its simulator mode name without amounts (`ddp`, `ddp-fp16`, `scalesgd-fp8`,
`periodic@16-fp8`); a peer's by its name before it (`torchft:periodic@10-fp32`), an inner optimizer other than the
model's own by its name after (`periodic@16-fp8+muon`). Steps to the target do not depend
on the link, so the table pools every rate a benchmark ran: an exchange reached it where most of its runs did (the
median of their steps over DDP's), and missed it where most ran all their steps without reaching it. They do depend
on the number of replicas M (the global batch fixed): a row holds the factor at each M measured, and `StepsToTarget.at`
reads it at any M (between and past them, a power law fitted; a periodic row measured at one M, the exponent of the
periodic rows measured at several)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from scalesgd.comm.codecs.cast import DENSE
from scalesgd.periodic.schedule import Schedule

TABLE = Path(__file__).with_name("steps_to_target.json")
FAMILIES = ("text", "image")  # language models, compared by validation loss; image classifiers, by accuracy


@dataclass(frozen=True)
class StepsToTarget:
    """One exchange's measured way to the target of its model family."""

    key: str  # the mode name as above
    options: str  # the `train` options it ran with (a periodic mode's outer settings and epochs among them)
    factor: float | None  # its median steps to the target over DDP fp32's; None: it missed the target
    end: float  # its median final validation loss (text) or accuracy (image)
    runs: int  # the runs behind the figure
    source: str  # the benchmark directory
    workers: int = 2  # the workers (replicas) `factor` was measured with
    by_workers: dict[int, float | None] = field(default_factory=dict)  # its factor measured at other worker counts
    borrowed_exponent: float | None = None  # measured at one M: the M exponent its family's rows show (`table`)
    basis: str = "measured"  # how `at` read it: measured, fitted, borrowed, per step (as DDP) or as at another M

    @property
    def missed(self) -> bool:
        return self.factor is None

    def at(self, workers: int) -> StepsToTarget:
        """This row for a run of `workers` workers: the factor measured there, missed where it missed at fewer (more
        replicas at a fixed batch do not make it up), else the power law in M fitted to the counts measured
        (`scaling_in_workers`), else the borrowed exponent from its one count, else the row's own (a per-step
        exchange trains as DDP does at any M)."""
        measured = {self.workers: self.factor, **self.by_workers}
        law = scaling_in_workers(measured)
        if workers in measured:
            factor, basis = measured[workers], "measured"
        elif any(f is None and m <= workers for m, f in measured.items()):
            factor, basis = None, "measured"
        elif law is not None:
            factor, basis = law(workers), "fitted"
        elif self.borrowed_exponent is not None and self.factor is not None:
            factor, basis = self.factor * (workers / self.workers) ** self.borrowed_exponent, "borrowed"
        else:
            factor, basis = self.factor, f"as at {self.workers}" if "periodic@" in self.key else "per step"
        return replace(self, factor=factor, workers=workers, by_workers={}, basis=basis)


@dataclass(frozen=True)
class PowerLaw:
    """factor(M) = coefficient · M^exponent."""

    coefficient: float
    exponent: float

    def __call__(self, workers: int) -> float:
        return self.coefficient * workers ** self.exponent


def scaling_in_workers(measured: dict[int, float | None]) -> PowerLaw | None:
    """Steps to the target against the number of replicas M as a power law, least squares in log–log over the counts
    that reached the target — the form Charles et al. 2025 ("Communication-Efficient Language Model Training Scales
    Reliably and Robustly: Scaling Laws for DiLoCo") fit DiLoCo's dependence on M with; None under two counts."""
    points = sorted((m, f) for m, f in measured.items() if f is not None and m > 0)
    if len(points) < 2:
        return None
    xs, ys = [math.log(m) for m, _ in points], [math.log(f) for _, f in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread if spread else 0.0
    return PowerLaw(math.exp(my - slope * mx), slope)


def family_of(text: bool) -> str:
    return "text" if text else "image"


def _shipped(family: str, path: Path) -> dict[str, dict]:
    """The table's raw rows for a model family, every optimizer's; empty where none were shipped."""
    return json.loads(path.read_text()).get(family, {}) if path.is_file() else {}


def other_optimizers(family: str, path: Path = TABLE) -> list[str]:
    """The optimizers besides its models' own whose steps the shipped table holds for a model family."""
    return sorted({key.rpartition("+")[2] for key in _shipped(family, path) if "+" in key})


def table(family: str, path: Path = TABLE, optimizer: str = "") -> dict[str, StepsToTarget]:
    """The shipped measurements for a model family ("text" or "image") under its models' own optimizer, or under
    `optimizer` (its rows, the "+" name dropped, and each per-step row through DDP's under it), by key; empty where
    none were shipped. A periodic row measured at one M borrows the median exponent of the family's periodic rows
    measured at several (DiLoCo's dependence on M, assumed alike for its variants), so that no prediction holds it
    flat in M."""
    shipped = {key: StepsToTarget(key=key, **{**row, "by_workers": {int(m): f for m, f in row.get("by_workers",
                                                                                                 {}).items()}})
               for key, row in _shipped(family, path).items()}
    out = {key: row for key, row in shipped.items() if "+" not in key}
    if optimizer:
        out = {**_per_step_under(out, shipped.get(f"ddp+{optimizer}")),
               **{key.removesuffix(f"+{optimizer}"): replace(row, key=key.removesuffix(f"+{optimizer}"))
                  for key, row in shipped.items() if key.endswith(f"+{optimizer}")}}
    periodic = [row for row in out.values() if "periodic@" in row.key]
    laws = [scaling_in_workers({row.workers: row.factor, **row.by_workers}) for row in periodic]
    exponents = [law.exponent for law in laws if law is not None]
    if not exponents:
        return out
    exponent = statistics.median(exponents)
    return {**out, **{row.key: replace(row, borrowed_exponent=exponent) for row, law in zip(periodic, laws)
                      if law is None}}


def _per_step_under(recipe: dict[str, StepsToTarget], ddp: StepsToTarget | None) -> dict[str, StepsToTarget]:
    """The per-step rows under another optimizer where only DDP's (`ddp`) was measured with it: each its codec's
    factor under the recipe × DDP's under the optimizer (a per-step exchange steps as DDP does, its codec's cost in
    steps kept)."""
    if ddp is None or ddp.missed:
        return {}
    return {key: replace(row, factor=row.factor and row.factor * ddp.factor,
                         by_workers={m: f and f * ddp.factor for m, f in row.by_workers.items()},
                         source=f"{row.source} × {ddp.key}")
            for key, row in recipe.items() if "periodic@" not in key and ":" not in key}


def key_of(engine: str, codec: str, schedule: Schedule | None = None, peer: str = "", optimizer: str = "") -> str:
    """An exchange's key: the simulator's mode name, amounts left out (a rank or density does not name a row); an
    optimizer other than the model's own after a "+" (its steps are its own, not the exchange's under the recipe)."""
    if schedule is not None:
        name = f"periodic@{schedule.name}-{codec}"
    else:
        name = engine if engine == "ddp" and codec == DENSE.name else f"{engine}-{codec}"
    name = f"{name}+{optimizer}" if optimizer else name
    return f"{peer}:{name}" if peer else name


def mode_key(mode) -> str:
    """A simulator mode's key (its amounts and buckets left out)."""
    return key_of(mode.engine, mode.codec, mode.schedule)


def per_reference_step(iteration_s: float, factor: float | None) -> float:
    """Seconds to the target per step DDP fp32 takes to it: the mode's step (a round's share) × its steps to the
    target over DDP fp32's (1 where none was measured): the one way a time to the target is predicted."""
    return iteration_s * (factor if factor is not None else 1.0)


def to_target(iteration_s: float, row: StepsToTarget | None) -> float | None:
    """`per_reference_step` where the table has the mode's row; None where it missed the target or none was
    measured."""
    return None if row is None or row.missed else per_reference_step(iteration_s, row.factor)


def merged(records: list[dict[str, StepsToTarget]]) -> dict[str, StepsToTarget]:
    """Several benchmarks' rows: for each key and worker count the row measured over the most runs (the later one
    on a tie); the fewest workers' row holds the others' factors (`by_workers`)."""
    best: dict[tuple[str, int], StepsToTarget] = {}
    for rows in records:
        for k, row in rows.items():
            for m, factor in row.by_workers.items():  # what a merged row carried: kept unless measured again
                best.setdefault((k, m), replace(row, factor=factor, workers=m, runs=0, by_workers={}))
            mine = replace(row, by_workers={})
            if (k, row.workers) not in best or row.runs >= best[(k, row.workers)].runs:
                best[(k, row.workers)] = mine
    out: dict[str, StepsToTarget] = {}
    for (k, m), row in sorted(best.items()):
        if k not in out:
            out[k] = row
        else:
            out[k] = replace(out[k], by_workers={**out[k].by_workers, m: row.factor})
    return out


def write(tables: dict[str, dict[str, StepsToTarget]], path: Path = TABLE) -> None:
    path.write_text(json.dumps({family: {k: {f: v for f, v in asdict(row).items()
                                             if f not in ("key", "borrowed_exponent", "basis")
                                             and not (f == "by_workers" and not v)}
                                         for k, row in sorted(rows.items())}
                                for family, rows in tables.items()}, indent=1) + "\n")
