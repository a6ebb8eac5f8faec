"""Steps to a model family's target quality per exchange, against DDP fp32's, as `scalesgd bench quality` measured
them (shipped with the package in steps_to_target.json): what turns a predicted step or round time into a predicted
time to the target, and what keeps an exchange that missed the target from being chosen.

An exchange is keyed by its simulator mode name without amounts (`ddp`, `ddp-fp16`, `scalesgd-fp8`,
`periodic@16-fp8`); a peer's by its name before it (`torchft:periodic@10-fp32`). Steps to the target do not depend
on the link, so the table pools every rate a benchmark ran: an exchange reached it where most of its runs did (the
median of their steps over DDP's), and missed it where most ran all their steps without reaching it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
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

    @property
    def missed(self) -> bool:
        return self.factor is None


def family_of(text: bool) -> str:
    return "text" if text else "image"


def table(family: str, path: Path = TABLE) -> dict[str, StepsToTarget]:
    """The shipped measurements for a model family ("text" or "image"), by key; empty where none were shipped."""
    rows = json.loads(path.read_text()).get(family, {}) if path.is_file() else {}
    return {key: StepsToTarget(key=key, **row) for key, row in rows.items()}


def key_of(engine: str, codec: str, schedule: Schedule | None = None, peer: str = "") -> str:
    """An exchange's key: the simulator's mode name, amounts left out (a rank or density does not name a row)."""
    if schedule is not None:
        name = f"periodic@{schedule.name}-{codec}"
    else:
        name = engine if engine == "ddp" and codec == DENSE.name else f"{engine}-{codec}"
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
    """Several benchmarks' rows: for each key the row measured over the most runs (the later one on a tie)."""
    best: dict[str, StepsToTarget] = {}
    for rows in records:
        for k, row in rows.items():
            if k not in best or row.runs >= best[k].runs:
                best[k] = row
    return best


def write(tables: dict[str, dict[str, StepsToTarget]], path: Path = TABLE) -> None:
    path.write_text(json.dumps({family: {k: {f: v for f, v in asdict(row).items() if f != "key"}
                                         for k, row in sorted(rows.items())}
                                for family, rows in tables.items()}, indent=1) + "\n")
