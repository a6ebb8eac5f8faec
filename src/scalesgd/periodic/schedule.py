"""When periodic synchronisation exchanges: H inner steps a round, the model in F fragments each synchronised once a
round on a staggered schedule, each exchange running τ inner steps behind before it lands (Douillard et al. 2025,
"Streaming DiLoCo with overlapping communication"; one fragment and no overlap is DiLoCo's every H steps). The one
owner of these three numbers: validated here, parsed and named here, turned into options here.

    schedule = Schedule.parse("16/4/1")        # H 16, F 4, τ 1: a fragment lands every 4 steps, sent 1 step before
    schedule.name, schedule.options()          # '16/4/1', {'local_steps': 16, 'fragments': 4, 'overlap_steps': 1}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

MAX_LOCAL_STEPS = 1_000_000
_SHAPE = re.compile(r"(\d+)(?:/(\d+)(?:/(\d+))?)?$")


def _whole(name: str, value, low: int, high: int | None = None, why: str = "") -> None:
    """A whole number in [low, high]: TypeError naming `name` for another type, ValueError for another value."""
    accepted = f"{low} to {high}" if high is not None else f"at least {low}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} {value!r}: give a whole number, {accepted}{why}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} {value}: give {accepted}{why}")


@dataclass(frozen=True)
class Schedule:
    """`local_steps` (H) inner steps a round; `fragments` (F, dividing H) fragments, fragment f landing after inner
    steps (k·F + f + 1)·H/F; each exchange started `overlap_steps` (τ, below H/F) steps before it lands, running
    meanwhile. The names are the options' (`--local-steps`, `--fragments`, `--overlap-steps`)."""

    local_steps: int
    fragments: int = 1
    overlap_steps: int = 0

    def __post_init__(self):
        _whole("local_steps", self.local_steps, 1, MAX_LOCAL_STEPS)
        _whole("fragments", self.fragments, 1, self.local_steps, f" (a divisor of local_steps {self.local_steps})")
        if self.local_steps % self.fragments:
            raise ValueError(f"fragments {self.fragments}: give a divisor of local_steps {self.local_steps}")
        _whole("overlap_steps", self.overlap_steps, 0, self.period - 1,
               f" (a fragment's exchange lands before its next one starts, every local_steps/fragments = "
               f"{self.period} steps)")

    # ---- what it means -------------------------------------------------------------------------------
    @property
    def period(self) -> int:
        """Inner steps between one fragment's landing and the next fragment's."""
        return self.local_steps // self.fragments

    def lands(self, step: int) -> int | None:
        """The fragment whose exchange lands after inner step `step` (counted from 1), or None."""
        return (step // self.period - 1) % self.fragments if step >= 1 and step % self.period == 0 else None

    def starts(self, step: int) -> int | None:
        """The fragment whose exchange starts after inner step `step`, or None."""
        return self.lands(step + self.overlap_steps)

    def round_of(self, landing: int) -> int:
        """The round (from 0) of the exchange that lands after inner step `landing`."""
        return (landing // self.period - 1) // self.fragments

    def rounds_in(self, steps: int) -> int:
        """Whole rounds in `steps` inner steps (at least 1: a codec counts its schedules in rounds)."""
        return max(1, steps // self.local_steps)

    def fits(self, layers: int) -> str | None:
        """Why a model of `layers` layers with parameters cannot be cut into this schedule's fragments, or None."""
        if self.fragments > layers:
            return (f"fragments {self.fragments}: the model has {layers} layers with parameters; give 1 to "
                    f"{layers} dividing local_steps {self.local_steps}")
        return None

    # ---- its names -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """H[/F[/τ]], the shortest that says it: `periodic@NAME-CODEC` names a mode in tables and `simulate`."""
        shown = (self.local_steps, self.fragments, self.overlap_steps)
        return "/".join(str(n) for n in shown[:3 if self.overlap_steps else 2 if self.fragments > 1 else 1])

    def describe(self) -> str:
        """In words, for reports: 'every 16 steps, 4 fragments 1 step behind'."""
        if self.fragments == 1 and not self.overlap_steps:
            return f"every {self.local_steps} steps"
        behind = f"{self.overlap_steps} step{'s' if self.overlap_steps != 1 else ''} behind"
        return f"every {self.local_steps} steps, {self.fragments} fragments {behind}"

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """`H[/F[/τ]]` (ValueError naming what is wrong)."""
        found = _SHAPE.match(text)
        if not found:
            raise ValueError(f"schedule {text!r}: give H[/F[/τ]]: local steps, fragments dividing them, overlap "
                             "steps below H/F (e.g. 16, 16/4 or 16/4/1)")
        return cls(int(found[1]), int(found[2] or 1), int(found[3] or 0))

    # ---- as options ----------------------------------------------------------------------------------
    def options(self) -> dict[str, int]:
        """`scalesgd train`'s options for it, by flat name (config.json's keys)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def of(cls, options: dict) -> Schedule | None:
        """The schedule a run's options (by flat name, as config.json holds them) ask for; None where they exchange
        every step."""
        if not options.get("local_steps"):
            return None
        return cls(**{f.name: options[f.name] for f in fields(cls) if f.name in options})
