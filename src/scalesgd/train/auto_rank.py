"""`--exchange auto`'s ranking of what it predicted: by time to the target (the iteration × the steps to the target
bench quality measured), ties to fewer buckets, the finalists a trial should tell apart, and the periodic modes it
lists beside its choice. Pure functions of the candidates' rows."""

from __future__ import annotations

from scalesgd.comm.codecs import CODECS, CodecSettings
from scalesgd.comm.engine.exchange import parse_exchange
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.exchange import Costs, predict
from scalesgd.sim.modes import Mode, parse_mode
from scalesgd.sim.network import Cluster
from scalesgd.sim.quality import StepsToTarget

RESOLUTION = 0.03  # predictions closer than this are a tie (the testbed's runs move ±10 %)
FINALIST_MARGIN = 0.25  # codecs predicted within this of the fastest are tried for real (the model's worst
FINALISTS = 4           # error against the testbed is ~25 %); at most this many


def periodic_options(steps_table: dict[str, StepsToTarget], compute: ComputeProfile, cluster: Cluster,
                     costs: dict[str, Costs]) -> list[dict]:
    """Our periodic modes that reached the target for this model family, each predicted to it on this cluster: what
    auto shows beside its per-step choice (a periodic mode reached the target with its own options, such as a
    longer schedule, which auto does not impose on a run)."""
    rows = []
    for key, steps in steps_table.items():
        if key.startswith("periodic@") and not steps.missed:
            mode = parse_mode(key)
            p = predict(mode, compute, cluster, costs.get(proxy(mode.codec), Costs()))
            rows.append({"mode": key, "options": steps.options, "iteration_s": p.iteration_s,
                         "to_target_s": p.iteration_s * steps.factor})
    return sorted(rows, key=lambda r: r["to_target_s"])


def proxy(name: str) -> str:
    """The codec of ours whose measured costs stand for exchange `name`'s: its own, or the one its registration names
    (PyTorch's PowerSGD hook: our lowrank, which does the same work)."""
    codec = parse_exchange(name)[1]
    return CODECS[codec].cost_proxy or codec


def candidate_mode(name: str, settings: CodecSettings, algorithm: str, plan: str) -> Mode:
    """Exchange `name` as the simulator's mode, with every codec option of this run (DDP's: its own buckets)."""
    engine, codec = parse_exchange(name)
    return Mode(name, engine, codec, algorithm if engine == "scalesgd" else "native", plan, base=settings.options)


def to_target(row: dict) -> float:
    """A candidate's predicted time to the target per DDP fp32 step to it (its iteration where none was measured)."""
    return row.get("to_target_s", row["iteration_s"])


def eligible(table: list[dict]) -> list[dict]:
    """The candidates that did not miss the target (`bench quality`'s finding for this model family)."""
    return [row for row in table if not row.get("missed")]


def pick(table: list[dict]) -> dict:
    """The candidate with the fewest buckets among those predicted to reach the target within `RESOLUTION` of the
    soonest, never one that missed it.

    Predictions closer than the model's resolution are a tie; fewer buckets then win, as each bucket
    costs the engine a hand-over the model prices only roughly.
    """
    table = eligible(table)
    soonest = min(to_target(row) for row in table)
    tied = [row for row in table if to_target(row) <= soonest * (1 + RESOLUTION)]
    return min(tied, key=lambda row: (len(row["groups"]), to_target(row)))


def finalists(table: list[dict], best: dict) -> list[dict]:
    """`best`, then the fastest plan of each other exchange predicted within `FINALIST_MARGIN` of it; `FINALISTS` at
    most, one of them uncompressed where one is that close.

    Where predictions are this close the model cannot rank them (its error on the testbed reaches ~25 %,
    and a sparse codec's density drifts from the one its probe saw): a trial can. Not compressing at all is
    always among what is tried when it is close (Agarwal et al. 2022: it is often the fastest).
    """
    close = [row for row in sorted(eligible(table), key=to_target)
             if to_target(row) <= to_target(best) * (1 + FINALIST_MARGIN)]
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
