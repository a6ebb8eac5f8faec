"""The papers' clusters and workloads from their published parameters (cited in docs/SIMULATE.md), each with the
headline number the model must reproduce, and the modes the papers never measured (fp8, DLGS top-k) projected."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scalesgd.comm.cost.link import LinkCost
from scalesgd.sim import compute
from scalesgd.sim.calibrate import golden_min
from scalesgd.sim.exchange import Costs, predict
from scalesgd.sim.modes import parse_mode
from scalesgd.sim.network import Cluster

GB = 1e9


@dataclass(frozen=True)
class Preset:
    """A paper's cluster, model, modes (the published one first) and the headline it reports."""

    title: str
    profile: Callable[[], compute.ComputeProfile]
    cluster: Callable[[], Cluster]
    workers: tuple[int, ...]
    modes: list[str]
    headline: Callable[[list[dict]], dict]
    costs: Callable[[], dict[str, Costs]] = dict  # what each mode costs beyond the wire, assumed or derived


def _row(rows: list[dict], workers: int, mode: str) -> dict:
    return next(r for r in rows if r["workers"] == workers and r["mode"] == mode)


def _headline(name: str, predicted: float, published: float, unit: str) -> dict:
    return {"what": name, "predicted": predicted, "published": published, "unit": unit,
            "error": predicted / published - 1}


# --- Goyal et al.: ResNet-50, 32 per GPU, Big Basin servers of 8 P100, one 50 Gbit Ethernet NIC each ----------
GOYAL_MODE = "scalesgd-fp32-hierarchical_hd-size:1"  # reduce in the server, halving/doubling across, broadcast


def _goyal_headline(rows: list[dict]) -> dict:
    """Scaling efficiency from 8 to 256 GPUs: t_iter(8) / t_iter(256) at 32 images per GPU (000 L393, L401)."""
    return _headline("scaling efficiency, 8 → 256 P100", _row(rows, 8, GOYAL_MODE)["iteration_s"]
                     / _row(rows, 256, GOYAL_MODE)["iteration_s"], 0.90, "fraction")


GOYAL = Preset(
    "Goyal et al.: ResNet-50 at kn = 8k on 256 P100, 50 Gbit Ethernet",
    # backward 120 ms published (000 L211); forward assumed half of it: 180 ms for forward + backward
    lambda: compute.from_flops("resnet50", 0.180, 32, 224, 1000),
    lambda: Cluster(1, 8, inter=LinkCost(20e-6, 50e9 / 8), intra=LinkCost(10e-6, 20 * GB)),
    (8, 16, 32, 64, 128, 256),
    [GOYAL_MODE, "scalesgd-fp16-hierarchical_hd-size:1", "scalesgd-fp8-hierarchical-size:1",
     "scalesgd-topk@0.01-ring-size:1"],
    _goyal_headline,
    # the GPU codecs read and write each element a few times at P100 memory speed (732 GB/s): ~18 bytes each
    lambda: {"scalesgd-fp16-hierarchical_hd-size:1": Costs(12 / 732e9),
             "scalesgd-fp8-hierarchical-size:1": Costs(18 / 732e9),
             "scalesgd-topk@0.01-ring-size:1": Costs(12 / 732e9, inline_s_per_element=8 / 732e9)})


# --- Fujitsu: ResNet-50, 40 per GPU, ABCI nodes of 4 V100 and 2 × InfiniBand EDR ----------------------------------
FUJITSU_MODE = "scalesgd-fp16-hierarchical_hd-growing:1:2"  # fp16 gradients, groups growing from ≥ 1 MB (004 L122)
V100_IMAGES_PER_S = 1376  # NVIDIA's published MXNet ResNet-50 mixed-precision rate on one V100 16 GB (assumption)


def _fujitsu_headline(rows: list[dict]) -> dict:
    return _headline("images/s on 2,048 V100", _row(rows, 2048, FUJITSU_MODE)["images_per_s"], 1.73e6, "images/s")


FUJITSU = Preset(
    "Fujitsu: ResNet-50 at kn = 81,920 on 2,048 V100 (ABCI)",
    lambda: compute.from_flops("resnet50", 40 / V100_IMAGES_PER_S, 40, 224, 1000),
    lambda: Cluster(1, 4, inter=LinkCost(5e-6, 2 * 100e9 / 8), intra=LinkCost(5e-6, 50 * GB)),
    (4, 64, 256, 1024, 2048),
    [FUJITSU_MODE, "scalesgd-fp8-hierarchical-growing:1:2", "scalesgd-topk@0.01-ring-growing:1:2"],
    _fujitsu_headline,
    lambda: {"scalesgd-fp8-hierarchical-growing:1:2": Costs(18 / 900e9),
             "scalesgd-topk@0.01-ring-growing:1:2": Costs(12 / 900e9, inline_s_per_element=8 / 900e9)})


# --- Oyama et al.: one allreduce of 256 M elements, 16 nodes × 1 process, 4X FDR InfiniBand (7 GB/s) ------------
OYAMA_ELEMENTS = 256_000_000
OYAMA_FP32, OYAMA_FP16, OYAMA_FP8 = "scalesgd-fp32-ring-single", "scalesgd-fp16-ring-single", "scalesgd-fp8-ring-single"
OYAMA_HALF_OVER_FP8 = 1.56  # published (001 L264): the one ratio the CPU's summing cost is taken from


def _oyama_cluster() -> Cluster:
    return Cluster(1, 1, inter=LinkCost(2e-6, 7 * GB), intra=LinkCost(2e-6, 7 * GB))


def _oyama_profile() -> compute.ComputeProfile:
    """No compute: the iteration is the allreduce itself."""
    return compute.ComputeProfile(("buffer",), (OYAMA_ELEMENTS,), 0.0, (0.0,), 0.0, 1)


def _oyama_sum_cost() -> Costs:
    """The host's per-element summing cost, the same for every format, that makes half ÷ fp8 the published 1.56×."""
    cluster, profile = _oyama_cluster().with_nodes(16), _oyama_profile()

    def misfit(cost: float) -> float:
        half, fp8 = (predict(parse_mode(m), profile, cluster, Costs(cost)).iteration_s for m in (OYAMA_FP16, OYAMA_FP8))
        return (half / fp8 - OYAMA_HALF_OVER_FP8) ** 2

    return Costs(golden_min(misfit, 0.0, 1e-8))


def _oyama_headline(rows: list[dict]) -> dict:
    return _headline("fp8 allreduce speed-up over fp32, 256 M elements on 16 nodes",
                     _row(rows, 16, OYAMA_FP32)["iteration_s"] / _row(rows, 16, OYAMA_FP8)["iteration_s"], 3.21, "×")


def _oyama_costs() -> dict[str, Costs]:
    cost = _oyama_sum_cost()
    return {m: cost for m in (OYAMA_FP32, OYAMA_FP16, OYAMA_FP8)}


OYAMA = Preset(
    "Oyama et al.: fp8 allreduce of 256 M elements, 1 process per node, 4X FDR InfiniBand",
    _oyama_profile, _oyama_cluster, (2, 4, 8, 16, 32), [OYAMA_FP32, OYAMA_FP16, OYAMA_FP8], _oyama_headline,
    _oyama_costs)

PRESETS: dict[str, Preset] = {"goyal": GOYAL, "fujitsu": FUJITSU, "oyama": OYAMA}
