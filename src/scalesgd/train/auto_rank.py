"""`--exchange auto`'s ranking of what it predicted: each way to exchange a `Candidate` (an exchange in a bucket plan,
or a periodic mode bench quality measured), ranked by time to the target (the iteration × the steps to the target),
ties to exchanging every step and then to fewer buckets; the finalists a trial should tell apart; which measured
periodic modes it may choose (those that change only how the run exchanges) or only list. Pure functions of the
candidates and the run's configuration."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field

from scalesgd.comm.codecs import CODECS, CodecSettings
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.codecs.registry import SHARDED_ENGINE
from scalesgd.comm.config import AUTO_CODECS, ExchangeConfig
from scalesgd.comm.engine.exchange import parse_exchange
from scalesgd.config import TrainConfig, rules
from scalesgd.errors import UsageError
from scalesgd.options import flat_options, parse
from scalesgd.periodic.config import PeriodicConfig
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.exchange import Costs, predict
from scalesgd.sim.modes import Mode, parse_mode
from scalesgd.sim.network import Cluster
from scalesgd.sim import quality
from scalesgd.sim.quality import StepsToTarget, per_reference_step

AUTO_ONLY = {"exchange": "manual", "auto_codecs": AUTO_CODECS, "auto_periodic": True}  # a manual run's own values
RESOLUTION = 0.03  # predictions closer than this are a tie (the testbed's runs move ±10 %)
FINALIST_MARGIN = 0.25  # codecs predicted within this of the fastest are tried for real (the model's worst
FINALISTS = 4           # error against the testbed is ~25 %); at most this many


@dataclass(frozen=True)
class Candidate:
    """One way auto may exchange and what the simulator predicts of it: `exchange` (a name `parse_exchange` reads) in
    the bucket plan `plan` ("ddp": DDP's own; "units": the sharded engine's), or, with `settings`, the periodic mode
    `mode` of bench quality's table (the options by flat name that switch the run to it)."""

    exchange: str
    iteration_s: float
    exposed_comm_s: float
    plan: str = ""
    groups: tuple[tuple[int, ...], ...] = field(default=(), compare=False)  # the plan's layer groups (backward
    #                                                                              order; auto.json keeps their count)
    steps_factor: float | None = None  # its steps to the target over DDP fp32's (None: not measured)
    missed: bool = False  # bench quality found it missing the target: never chosen
    mode: str = ""
    settings: dict | None = field(default=None, compare=False)

    @property
    def periodic(self) -> bool:
        return self.settings is not None

    @property
    def to_target_s(self) -> float:
        """Its predicted time to the target per DDP fp32 step to it (its iteration where none was measured)."""
        return per_reference_step(self.iteration_s, self.steps_factor)

    @property
    def shown(self) -> str:
        """Its plan, or its periodic mode."""
        return self.mode if self.periodic else self.plan

    def to_dict(self, groups: bool = False) -> dict:
        """As auto.json and summary.json keep it: the groups by count (`groups`: themselves too)."""
        row = {k: v for k, v in asdict(self).items() if k not in ("groups", "settings")}
        return {**row, "buckets_n": len(self.groups), "to_target_s": self.to_target_s,
                **({"groups": [list(g) for g in self.groups]} if groups else {}),
                **({"settings": self.settings} if self.periodic else {})}

    @classmethod
    def from_dict(cls, d: dict) -> Candidate:
        """A candidate auto.json kept (an earlier version's: its exchange as `codec`, its plan or periodic mode as
        `buckets`)."""
        if "exchange" not in d:
            periodic = "settings" in d
            d = {"exchange": d["codec"], "iteration_s": d["iteration_s"], "exposed_comm_s": d["exposed_comm_s"],
                 "plan": "" if periodic else d["buckets"], "mode": d["buckets"] if periodic else "",
                 "steps_factor": d.get("steps_factor"), "missed": d.get("missed", False),
                 "settings": d.get("settings"), "groups": d.get("groups", ())}
        return cls(d["exchange"], d["iteration_s"], d["exposed_comm_s"], d.get("plan", ""),
                   tuple(map(tuple, d.get("groups", ()))), d.get("steps_factor"), d.get("missed", False),
                   d.get("mode", ""), d.get("settings"))


def steps_for(cfg: TrainConfig) -> tuple[str, dict[str, StepsToTarget]]:
    """The steps to the target a run's candidates are ranked by, and whose: its optimizer's where it is not its
    model's own and was measured ("muon": Muon's fewer steps are its own), else the model's recipe's ("")."""
    family = quality.family_of(cfg.data.text)
    optimizer = cfg.other_optimizer if cfg.other_optimizer in quality.other_optimizers(family) else ""
    return optimizer, quality.table(family, optimizer=optimizer)


def periodic_settings(steps: StepsToTarget, cfg: TrainConfig) -> dict | None:
    """The options (by flat name) that switch this run to a periodic mode of the table, where auto may choose it: one
    of ours that reached the target, whose other options (a longer schedule) are this run's own, with a codec auto
    weighs here, valid with the rest of the run; else None (auto may only list it).

    Auto chooses how a run exchanges, never what it trains: a mode measured on another recipe is shown, not imposed.
    """
    if not (steps.key.startswith("periodic@") and not steps.missed and cfg.exchange.auto_periodic):
        return None
    try:
        given = parse(TrainConfig, shlex.split(steps.options), "scalesgd train")
        exchange = {flat.name for cls in (ExchangeConfig, PeriodicConfig) for flat in flat_options(cls)}
        own = cfg.to_dict()
        if any(own[name] != value for name, value in given.items() if name not in exchange) or given.get("peer") \
                or periodic_codec(given) not in rules.auto_fitting(cfg)[0]:
            return None
        settings = {name: value for name, value in given.items() if name in exchange}
        cfg.replaced(**{**AUTO_ONLY, **settings}).validate()  # as the run it switches to: manual
    except UsageError:
        return None
    return settings


def periodic_codec(settings: dict) -> str:
    """The codec a periodic mode's options send its pseudo-gradient through."""
    return settings.get("codec", DENSE.name)


def periodic_options(steps_table: dict[str, StepsToTarget], compute: ComputeProfile, cluster: Cluster,
                     costs: dict[str, Costs], candidates: dict | None = None) -> list[dict]:
    """Our periodic modes that reached the target for this model family, each predicted to it on this cluster: what
    auto shows beside its choice where it may not choose them (they reached the target with a recipe of their own,
    such as a longer schedule, which auto does not impose on a run); `candidates`: those it ranks instead."""
    rows = []
    for key, measured in steps_table.items():
        steps = measured.at(cluster.workers)
        if key.startswith("periodic@") and not steps.missed and key not in (candidates or {}):
            mode = parse_mode(key)
            p = predict(mode, compute, cluster, costs.get(proxy(mode.codec), Costs()))
            rows.append({"mode": key, "options": steps.options, "iteration_s": p.iteration_s,
                         "to_target_s": per_reference_step(p.iteration_s, steps.factor)})
    return sorted(rows, key=lambda r: r["to_target_s"])


def periodic_candidate(steps: StepsToTarget, settings: dict, compute: ComputeProfile, cluster: Cluster,
                       costs: Costs) -> Candidate:
    """A periodic mode auto may choose: its round's share of a step predicted, its steps to the target measured (at
    the cluster's worker count, or the power law in M fitted to the counts measured)."""
    steps = steps.at(cluster.workers)
    p = predict(parse_mode(steps.key), compute, cluster, costs)
    return Candidate(periodic_codec(settings), p.iteration_s, p.exposed_comm_s, steps_factor=steps.factor,
                     missed=steps.missed, mode=steps.key, settings=settings)  # missed at this M: never chosen


def proxy(name: str) -> str:
    """The codec of ours whose measured costs stand for exchange `name`'s: its own, or the one its registration names
    (PyTorch's PowerSGD hook: our lowrank, which does the same work)."""
    codec = parse_exchange(name)[1]
    return CODECS[codec].cost_proxy or codec


def candidate_mode(name: str, settings: CodecSettings, algorithm: str, plan: str, shard: str | None = None) -> Mode:
    """Exchange `name` as the simulator's mode, with every codec option of this run (DDP's: its own buckets); with a
    `shard` scope ("" every rank's shards, "node" each node's), its codec on the sharded engine's sums, unit by
    unit."""
    engine, codec = parse_exchange(name)
    if shard is not None:
        return Mode(name, SHARDED_ENGINE, codec, "ring", "units", base=settings.options, shard=shard)
    return Mode(name, engine, codec, algorithm if engine == "scalesgd" else "native", plan, base=settings.options)


def eligible(table: list[Candidate]) -> list[Candidate]:
    """The candidates that did not miss the target (`bench quality`'s finding for this model family)."""
    return [c for c in table if not c.missed]


def pick(table: list[Candidate]) -> Candidate:
    """Among the candidates predicted to reach the target within `RESOLUTION` of the soonest, one exchanging every
    step with the fewest buckets, never one that missed it.

    Predictions closer than the model's resolution are a tie; exchanging every step then wins (it keeps the
    workers' parameters equal), then fewer buckets, as each bucket costs the engine a hand-over the model prices
    only roughly.
    """
    table = eligible(table)
    soonest = min(c.to_target_s for c in table)
    tied = [c for c in table if c.to_target_s <= soonest * (1 + RESOLUTION)]
    return min(tied, key=lambda c: (c.periodic, len(c.groups), c.to_target_s))


def finalists(table: list[Candidate], best: Candidate) -> list[Candidate]:
    """`best`, then the fastest plan of each other exchange predicted within `FINALIST_MARGIN` of it; `FINALISTS` at
    most, one of them uncompressed where one is that close.

    Where predictions are this close the model cannot rank them (its error on the testbed reaches ~25 %,
    and a sparse codec's density drifts from the one its probe saw): a trial can. Not compressing at all is
    always among what is tried when it is close (Agarwal et al. 2022: it is often the fastest).
    """
    close = [c for c in sorted(eligible(table), key=lambda c: c.to_target_s)  # a round is no trial's length
             if not c.periodic and c.to_target_s <= best.to_target_s * (1 + FINALIST_MARGIN)]
    chosen, seen = [best], {best.exchange}
    for c in close:
        if c.exchange not in seen:
            chosen.append(c)
            seen.add(c.exchange)
    plain = next((c for c in close if uncompressed(c.exchange)), None)
    if plain is not None and not any(uncompressed(c.exchange) for c in chosen[:FINALISTS]):
        return chosen[:FINALISTS - 1] + [plain]
    return chosen[:FINALISTS]


def uncompressed(exchange: str) -> bool:
    """Whether an exchange sends fp32, as if nothing compressed it."""
    return CODECS[parse_exchange(exchange)[1]].wire_bytes == 4
