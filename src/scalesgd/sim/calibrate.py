"""From a `bench train` directory: the cluster it ran on, the compute and codec costs it measured, and
predictions of its modes checked against what it measured (`simulate --validate`)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from scalesgd.comm.codecs import CODECS, make_codec
from scalesgd.comm.cost.link import LinkCost
from scalesgd.models import MODELS, TEXT
from scalesgd.sim.compute import ComputeProfile, from_layers, model_shapes
from scalesgd.sim.exchange import Costs, check_modelled, nominal_sparse_bytes, predict
from scalesgd.sim.modes import parse_mode
from scalesgd.sim.network import Cluster

GOLDEN = (math.sqrt(5) - 1) / 2
MAX_CHANNEL_S_PER_ELEMENT = 1e-6  # far beyond any codec here (fp8's whole pipeline costs ~10 ns per element)


class NotABenchDir(ValueError):
    """The directory holds no `bench train` record with what the simulator needs."""


@dataclass(frozen=True)
class BenchRecord:
    """A `bench train` run's train.json: topology, the links at each rate, the layer profile, every result."""

    path: Path
    data: dict

    @classmethod
    def load(cls, directory: str | Path) -> BenchRecord:
        path = Path(directory) / "train.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            raise NotABenchDir(f"{directory} is not a `scalesgd bench train` output directory (no readable "
                               "train.json)") from None
        missing = [k for k in ("topology", "links", "layers", "results") if k not in data]
        if missing:
            raise NotABenchDir(f"{path} lacks {', '.join(missing)}: it was written before `bench train` recorded "
                               "what the simulator needs; measure again")
        return cls(Path(directory), data)

    @property
    def rates(self) -> list[str | None]:
        return [link["bandwidth"] for link in self.data["links"]]

    def cluster(self, rate: str | None) -> Cluster:
        """The cluster as measured at `rate`: its topology and the links' α and β."""
        link = next(l for l in self.data["links"] if l["bandwidth"] == rate)
        inter, intra = (LinkCost.from_dict(link[k]) if link[k] else None for k in ("inter", "intra"))
        topo = self.data["topology"]
        return Cluster(topo["nodes"], topo["procs_per_node"], inter or intra, intra or inter)

    def result(self, rate: str | None, mode: str) -> dict | None:
        return next((r for r in self.data["results"] if r["bandwidth"] == rate and r["mode"] == mode), None)

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(r["mode"] for r in self.data["results"]))

    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The timed model's tensor shapes, for a record written before `bench train` kept them: an image model's,
        rebuilt from its config (none for a language model, whose sizes options it did not keep as such)."""
        config = self.data["config"]
        if config.get("model") not in MODELS or MODELS[config["model"]].data == TEXT:
            return ()
        return model_shapes(config["model"], config["classes"], config["channels"])

    @property
    def batch_per_worker(self) -> int:
        return self.data["config"]["batch_size"] // self.data["world_size"]


def compute_profile(record: BenchRecord) -> ComputeProfile:
    """The layer profile's shape at the `none` mode's measured compute and step (medians over the rates)."""
    nones = [r for r in record.data["results"] if r["mode"] == "none"]
    if not nones:
        raise NotABenchDir(f"{record.path} has no `none` mode: the compute-only iteration calibrates the profile")
    compute = statistics.median(r["mean_compute_s"] for r in nones)
    step = statistics.median(max(r["median_iteration_s"] - r["mean_compute_s"], 0.0) for r in nones)
    profile = from_layers(record.data["layers"], step, record.batch_per_worker).scaled_to(compute)
    return profile if profile.shapes else replace(profile, shapes=record.shapes())


def mode_costs(record: BenchRecord, mode_name: str, profile: ComputeProfile) -> Costs:
    """A mode's costs as `record` measured them: exchange CPU against `none`'s, selection on backward's path,
    and the codec's channel cost per element, fitted so the model meets the measured iterations at every rate."""
    mode = parse_mode(mode_name)
    check_modelled(mode)
    rows = [(rate, record.result(rate, mode_name), record.result(rate, "none")) for rate in record.rates]
    rows = [(rate, r, n) for rate, r, n in rows if r is not None and n is not None]
    if not rows:
        raise NotABenchDir(f"{record.path} did not measure mode {mode_name!r}")
    cpu = statistics.median(max(r.get("mean_cpu_s", 0.0) - n.get("mean_cpu_s", 0.0), 0.0) for _, r, n in rows)
    inline = 0.0
    if mode.engine == "scalesgd" and make_codec(mode.codec).encode_in_backward:
        inline = statistics.median(r.get("mean_codec_s", 0.0) for _, r, _ in rows) / profile.numel

    scales = {rate: density_scale(record, mode, profile, r) for rate, r, _ in rows}

    def misfit(channel: float) -> float:
        return sum(math.log(predict(mode, profile, record.cluster(rate), Costs(channel, inline, cpu,
                                                                                 density_scale=scales[rate]))
                            .iteration_s / r["median_iteration_s"]) ** 2 for rate, r, _ in rows)

    return Costs(golden_min(misfit, 0.0, MAX_CHANNEL_S_PER_ELEMENT), inline, cpu,
                 density_scale=statistics.median(scales.values()))


def density_scale(record: BenchRecord, mode, profile: ComputeProfile, result: dict) -> float:
    """A sparse (all-rank) mode's bytes sent as measured ÷ at its nominal density; 1 for every other mode."""
    entry = CODECS[mode.codec] if mode.engine != "none" else None
    if entry is None or not entry.sparse or entry.needs_topology or "mean_bytes_sent" not in result:
        return 1.0
    nominal = nominal_sparse_bytes(mode, profile, record.data["world_size"])
    return result["mean_bytes_sent"] / nominal if nominal else 1.0


def golden_min(f, lo: float, hi: float, rounds: int = 48) -> float:
    """The minimum of a unimodal `f` on [lo, hi], by golden-section search."""
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(rounds):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    best = (a + b) / 2
    return lo if f(lo) <= f(best) else best


@dataclass(frozen=True)
class Calibration:
    """What one or more `bench train` runs measured of the compute and of each mode's costs (their means)."""

    profile: ComputeProfile
    costs: dict[str, Costs]
    records: tuple[BenchRecord, ...] = ()

    @classmethod
    def of(cls, record: BenchRecord, modes: list[str] | None = None) -> Calibration:
        return cls.pooled([record], modes)

    @classmethod
    def pooled(cls, records: list[BenchRecord], modes: list[str] | None = None) -> Calibration:
        """The mean over `records` of each measured quantity: more runs, less of one run's noise."""
        profiles = [compute_profile(r) for r in records]
        first = profiles[0]
        if any(p.sizes != first.sizes for p in profiles):
            raise NotABenchDir("the calibration runs measured different models")
        n = len(profiles)
        profile = replace(first, t_f=sum(p.t_f for p in profiles) / n, t_step=sum(p.t_step for p in profiles) / n,
                          t_b=tuple(sum(col) / n for col in zip(*(p.t_b for p in profiles))))
        names = [m for m in dict.fromkeys(modes or [m for r in records for m in r.modes])
                 if m != "none" and _modelled(m)]
        costs = {}
        for name in names:
            measured = [mode_costs(r, name, p) for r, p in zip(records, profiles) if name in r.modes]
            if measured:
                costs[name] = Costs(*(sum(values) / len(values) for values in zip(*(
                    (c.channel_s_per_element, c.inline_s_per_element, c.exchange_cpu_s, c.channel_s_per_bucket,
                     c.density_scale) for c in measured))))
        return cls(profile, costs, tuple(records))

    def at_rate(self, mode: str, rate: str | None) -> Costs:
        """A mode's costs, with the sparse density the calibration measured at the same link rate where it ran
        there (threshold reuse drifts with the run's history, which runs of one protocol share)."""
        scales = [density_scale(r, parse_mode(mode), self.profile, result) for r in self.records
                  if (result := r.result(rate, mode)) is not None]
        return replace(self.costs[mode], density_scale=sum(scales) / len(scales)) if scales else self.costs[mode]


def _modelled(name: str) -> bool:
    try:
        check_modelled(parse_mode(name))
        return True
    except ValueError:
        return False


def validate_against(bench: BenchRecord, calibration: Calibration) -> list[dict]:
    """Every modelled mode of `bench` at every rate, predicted from `bench`'s links and `calibration`'s costs."""
    points = []
    for rate in bench.rates:
        cluster = bench.cluster(rate)
        for name in bench.modes:
            measured = bench.result(rate, name)
            if name == "none" or name not in calibration.costs or measured is None:
                continue
            costs = calibration.at_rate(name, rate)
            predicted = predict(parse_mode(name), calibration.profile, cluster, costs).iteration_s
            points.append({"mode": name, "bandwidth": rate, "measured_s": measured["median_iteration_s"],
                           "predicted_s": predicted, "error": predicted / measured["median_iteration_s"] - 1})
    return points


