"""Rows of a scaling study: every mode at every worker count, and iteration time against link rate."""

from __future__ import annotations

import math

from scalesgd.comm.cost.link import LinkCost
from scalesgd.sim.compute import ComputeProfile
from scalesgd.sim.exchange import Costs, predict
from scalesgd.sim.modes import Mode
from scalesgd.sim.network import Cluster

SWEEP_POINTS = 25  # link rates per decade … across the bandwidth plot


def rows(profile: ComputeProfile, cluster: Cluster, modes: list[Mode], workers: list[int],
         costs: dict[str, Costs]) -> list[dict]:
    """One row per worker count × mode: iteration, exposed exchange, images/s, scaling efficiency.

    Efficiency is images/s ÷ (workers × one worker's images/s without exchange); None where the profile has no
    compute (a bare collective).
    """
    alone = profile.batch_per_worker / profile.iteration_s if profile.iteration_s > 0 else None
    out = []
    for count in workers:
        sized = cluster.with_nodes(count // cluster.procs_per_node)
        for mode in modes:
            p = predict(mode, profile, sized, costs.get(mode.name, Costs()))
            images = count * profile.batch_per_worker / p.iteration_s if p.iteration_s > 0 else None
            out.append({"workers": count, "mode": mode.name, "iteration_s": p.iteration_s,
                        "exposed_comm_s": p.exposed_comm_s, "images_per_s": images,
                        "scaling_efficiency": images / (count * alone) if alone and images else None})
    return out


def bandwidth_sweep(profile: ComputeProfile, cluster: Cluster, modes: list[Mode], costs: dict[str, Costs],
                    low_bytes_s: float, high_bytes_s: float) -> dict:
    """Iteration time of every mode against the inter-node rate (α kept), and where each stops paying.

    A mode's crossover is the lowest rate from which it is no faster than the first mode (the baseline):
    "never" where it is faster at no rate swept, "beyond" where it is faster at every one.
    """
    steps = max(2, int(SWEEP_POINTS * math.log10(high_bytes_s / low_bytes_s)))
    rates = [low_bytes_s * (high_bytes_s / low_bytes_s) ** (i / (steps - 1)) for i in range(steps)]
    times = {m.name: [] for m in modes}
    for rate in rates:
        at = Cluster(cluster.nodes, cluster.procs_per_node, LinkCost(cluster.inter.alpha_s, rate), cluster.intra)
        for mode in modes:
            times[mode.name].append(predict(mode, profile, at, costs.get(mode.name, Costs())).iteration_s)
    baseline = times[modes[0].name]
    crossover = {}
    for mode in modes[1:]:
        pays = [t < b for t, b in zip(times[mode.name], baseline)]
        last = max((i for i, p in enumerate(pays) if p), default=None)
        crossover[mode.name] = "never" if last is None else rates[last + 1] if last + 1 < len(rates) else "beyond"
    return {"rates_bytes_s": rates, "iteration_s": times, "crossover_bytes_s": crossover,
            "baseline": modes[0].name}
