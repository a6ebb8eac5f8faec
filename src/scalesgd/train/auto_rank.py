"""`--exchange auto`'s ranking of what it predicted: by time to the target (the iteration × the steps to the target
bench quality measured), ties to exchanging every step and then to fewer buckets, the finalists a trial should tell
apart, and which measured periodic modes it may choose (those that change only how the run exchanges) or only list.
Pure functions of the candidates' rows and the run's configuration."""

from __future__ import annotations

import shlex

from scalesgd.comm.codecs import CODECS, CodecSettings
from scalesgd.comm.codecs.cast import DENSE
from scalesgd.comm.codecs.registry import SHARDED_ENGINE
from scalesgd.comm.config import ExchangeConfig
from scalesgd.comm.engine.exchange import parse_exchange
from scalesgd.config import TrainConfig, rules
from scalesgd.errors import UsageError
from scalesgd.options import flat_options, parse
from scalesgd.periodic.config import PeriodicConfig
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.exchange import Costs, predict
from scalesgd.sim.modes import Mode, parse_mode
from scalesgd.sim.network import Cluster
from scalesgd.sim.quality import StepsToTarget

RESOLUTION = 0.03  # predictions closer than this are a tie (the testbed's runs move ±10 %)
FINALIST_MARGIN = 0.25  # codecs predicted within this of the fastest are tried for real (the model's worst
FINALISTS = 4           # error against the testbed is ~25 %); at most this many


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
        cfg.replaced(exchange="manual", **settings).validate()
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
    for key, steps in steps_table.items():
        if key.startswith("periodic@") and not steps.missed and key not in (candidates or {}):
            mode = parse_mode(key)
            p = predict(mode, compute, cluster, costs.get(proxy(mode.codec), Costs()))
            rows.append({"mode": key, "options": steps.options, "iteration_s": p.iteration_s,
                         "to_target_s": p.iteration_s * steps.factor})
    return sorted(rows, key=lambda r: r["to_target_s"])


def periodic_row(steps: StepsToTarget, settings: dict, compute: ComputeProfile, cluster: Cluster,
                 costs: Costs) -> dict:
    """A periodic mode auto may choose as a candidate row: its round's share of a step predicted, × its steps to the
    target; named by its codec, its table key in the buckets' place, and the options that switch the run to it."""
    p = predict(parse_mode(steps.key), compute, cluster, costs)
    return {"codec": periodic_codec(settings), "buckets": steps.key, "iteration_s": p.iteration_s,
            "exposed_comm_s": p.exposed_comm_s, "groups": [], "steps_factor": steps.factor, "missed": False,
            "to_target_s": p.iteration_s * steps.factor, "settings": settings}


def proxy(name: str) -> str:
    """The codec of ours whose measured costs stand for exchange `name`'s: its own, or the one its registration names
    (PyTorch's PowerSGD hook: our lowrank, which does the same work)."""
    codec = parse_exchange(name)[1]
    return CODECS[codec].cost_proxy or codec


def candidate_mode(name: str, settings: CodecSettings, algorithm: str, plan: str, layout: str | None = None) -> Mode:
    """Exchange `name` as the simulator's mode, with every codec option of this run (DDP's: its own buckets); with a
    `layout` ("" every rank's shards, "node" each node's), its codec on the sharded engine's sums, unit by unit."""
    engine, codec = parse_exchange(name)
    if layout is not None:
        return Mode(name, SHARDED_ENGINE, codec, "ring", "units", base=settings.options, shard=layout)
    return Mode(name, engine, codec, algorithm if engine == "scalesgd" else "native", plan, base=settings.options)


def to_target(row: dict) -> float:
    """A candidate's predicted time to the target per DDP fp32 step to it (its iteration where none was measured)."""
    return row.get("to_target_s", row["iteration_s"])


def eligible(table: list[dict]) -> list[dict]:
    """The candidates that did not miss the target (`bench quality`'s finding for this model family)."""
    return [row for row in table if not row.get("missed")]


def pick(table: list[dict]) -> dict:
    """Among the candidates predicted to reach the target within `RESOLUTION` of the soonest, one exchanging every
    step with the fewest buckets, never one that missed it.

    Predictions closer than the model's resolution are a tie; exchanging every step then wins (it keeps the
    workers' parameters equal), then fewer buckets, as each bucket costs the engine a hand-over the model prices
    only roughly.
    """
    table = eligible(table)
    soonest = min(to_target(row) for row in table)
    tied = [row for row in table if to_target(row) <= soonest * (1 + RESOLUTION)]
    return min(tied, key=lambda row: ("settings" in row, len(row["groups"]), to_target(row)))


def finalists(table: list[dict], best: dict) -> list[dict]:
    """`best`, then the fastest plan of each other exchange predicted within `FINALIST_MARGIN` of it; `FINALISTS` at
    most, one of them uncompressed where one is that close.

    Where predictions are this close the model cannot rank them (its error on the testbed reaches ~25 %,
    and a sparse codec's density drifts from the one its probe saw): a trial can. Not compressing at all is
    always among what is tried when it is close (Agarwal et al. 2022: it is often the fastest).
    """
    close = [row for row in sorted(eligible(table), key=to_target)  # a periodic mode's round is no trial's length
             if "settings" not in row and to_target(row) <= to_target(best) * (1 + FINALIST_MARGIN)]
    chosen, seen = [best], {best["codec"]}
    for row in close:
        if row["codec"] not in seen:
            chosen.append(row)
            seen.add(row["codec"])
    plain = next((row for row in close if _uncompressed(row["codec"])), None)
    if plain is not None and not any(_uncompressed(row["codec"]) for row in chosen[:FINALISTS]):
        return chosen[:FINALISTS - 1] + [plain]
    return chosen[:FINALISTS]


def _uncompressed(exchange: str) -> bool:
    return CODECS[parse_exchange(exchange)[1]].wire_bytes == 4
