"""`scalesgd bench optimizer`: what one step() of LARS, LAMB, AdamW or Muon costs next to torch's SGD on a real model's
parameters, on this CPU (torch's Muon orthogonalises in bf16, which oneDNN computes only on AVX512 CPUs)."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from scalesgd import checks, output
from scalesgd.config.rules import onednn_bf16
from scalesgd.errors import UsageError
from scalesgd.models import MODELS, build_model
from scalesgd.optim import LAMB, LARS, NaiveLARS
from scalesgd.options import Options, option, words
from scalesgd.recipe import param_groups
from scalesgd.recipe.params import build_optimizer

LR, MOMENTUM = 0.1, 0.9
REFERENCE = "sgd"
# name → (what it is, how to build it on the model's parameter groups and their weight decay)
OPTIMIZERS = {
    "sgd": ("torch SGD, default: per tensor on CPU", lambda groups, _: torch.optim.SGD(groups, LR, MOMENTUM)),
    "sgd-foreach": ("torch SGD, foreach=True",
                    lambda groups, _: torch.optim.SGD(groups, LR, MOMENTUM, foreach=True)),
    "lars": ("LARS, batched", lambda groups, _: LARS(groups, LR, MOMENTUM)),
    "naive-lars": ("LARS, per tensor", lambda groups, _: NaiveLARS(groups, LR, MOMENTUM)),
    "lamb": ("LAMB, batched", lambda groups, _: LAMB(groups, LR)),
    "adamw": ("torch AdamW, the recipe's groups",
              lambda model, decay: build_optimizer(model, "adamw", 1e-3, MOMENTUM, False, decay)),
    "muon": ("torch Muon on the hidden matrices, AdamW the rest",
             lambda model, decay: build_optimizer(model, "muon", 1e-3, MOMENTUM, False, decay)),
}
ON_MODEL = ("adamw", "muon")  # built by the recipe on the model (its own groups), not on the shared groups


@dataclass
class OptimizerBenchConfig(Options):
    """`scalesgd bench optimizer`: one step() of each optimizer on one model's parameters, against torch's SGD."""

    model: str = option("resnet50", "the network whose parameters each optimizer steps", choices=MODELS)
    optimizers: tuple[str, ...] = option(("sgd", "lars", "lamb", "naive-lars"), f"with {REFERENCE}, the reference",
                                         choices=OPTIMIZERS, parse=words, check=checks.distinct)
    repeats: int = option(20, "timed steps per optimizer", check=checks.positive)
    warmup: int = option(3, "untimed steps first", check=checks.at_least(0))
    threads: int = option(1, "compute threads", check=checks.threads(1))
    weight_decay: float = option(5e-5, "weight decay of the decayed group (never BN γ/β)",
                                 check=checks.finite_non_negative)
    out: str = option("", "output directory", shown_default="runs/bench/optimizer-<timestamp>",
                      check=checks.output_dir)

    def validate(self) -> OptimizerBenchConfig:
        super().validate()
        if REFERENCE not in self.optimizers:
            raise UsageError(f"`optimizers` {','.join(self.optimizers)}: include {REFERENCE}, the reference of the "
                             "ratios")
        return self


def run(cfg: OptimizerBenchConfig, command: str) -> int:
    """Time each optimizer's step() on the same parameters and fixed gradients."""
    torch.set_num_threads(cfg.threads)
    load = os.getloadavg()  # other work on the machine widens the spread of the times
    model = build_model(cfg.model, 1000, 3)
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    # fresh group dicts each: torch optimizers fill their defaults into the dicts they are given
    optimizers = {name: OPTIMIZERS[name][1](model if name in ON_MODEL else param_groups(model, cfg.weight_decay),
                                            cfg.weight_decay) for name in cfg.optimizers}
    times = _time_steps(optimizers, cfg.warmup, cfg.repeats)
    reference = statistics.median(times[REFERENCE]), min(times[REFERENCE])
    results = [{"optimizer": name, "median_ms": 1e3 * statistics.median(t), "min_ms": 1e3 * min(t),
                "ratio_median": statistics.median(t) / reference[0], "ratio_min": min(t) / reference[1],
                "times_ms": [1e3 * s for s in t]} for name, t in times.items()]
    report(cfg, {"parameters": _describe(param_groups(model, cfg.weight_decay)), "load_average_1_5_15": load,
                 "cpu": cpu(), "results": results}, command)
    return 0


def _time_steps(optimizers: dict, warmup: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of each step(); the optimizers take turns, so a change in machine load hits them alike."""
    for opt in optimizers.values():
        for _ in range(warmup):
            opt.step()
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(repeats):
        for name, opt in optimizers.items():
            start = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - start)
    return times


def cpu() -> dict:
    """The vector instructions torch uses here, and whether oneDNN computes bf16 (torch's Muon's Newton–Schulz)."""
    return {"capability": torch.backends.cpu.get_cpu_capability(),
            "onednn_bf16": onednn_bf16()}


def _describe(groups: list[dict]) -> dict:
    return {"tensors": sum(len(g["params"]) for g in groups),
            "elements": sum(p.numel() for g in groups for p in g["params"]),
            "groups": [{"weight_decay": g["weight_decay"], "tensors": len(g["params"]),
                        "elements": sum(p.numel() for p in g["params"])} for g in groups]}


def report(cfg: OptimizerBenchConfig, measured: dict, command: str) -> None:
    params, results = measured["parameters"], measured["results"]
    columns = ["optimizer", "median ms", "min ms", f"÷ {REFERENCE} (median)", f"÷ {REFERENCE} (min)"]
    rows = [[f"{r['optimizer']} ({OPTIMIZERS[r['optimizer']][0]})", f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}",
             f"{r['ratio_median']:.2f}", f"{r['ratio_min']:.2f}"] for r in results]
    out = Path(cfg.out)
    output.write(out, "optimizer", {"config": cfg.to_dict(), **measured}, columns, rows, command)
    plot(out / "optimizer.png", cfg, params, results)
    output.console().print(output.rich_table(f"one step() on {cfg.model}: {params['tensors']} tensors, "
                                      f"{params['elements'] / 1e6:.1f} M parameters, {cfg.threads} thread(s), "
                                      f"{cfg.repeats} steps, {_cpu_words(measured['cpu'])}", columns, rows))
    output.console().print(f"written to {out}/optimizer.{{json,md,png}}", highlight=False)


def _cpu_words(cpu: dict) -> str:
    return f"CPU {cpu['capability']}, bf16 in oneDNN: {'yes' if cpu['onednn_bf16'] else 'no'}"


def plot(path: Path, cfg: OptimizerBenchConfig, params: dict, results: list[dict]) -> None:
    plt = output.pyplot()

    fig, ax = plt.subplots(figsize=(8, 0.5 * len(results) + 1.5))
    names = [r["optimizer"] for r in results][::-1]
    bars = ax.barh(names, [r["median_ms"] for r in results][::-1], color="tab:blue")
    ax.bar_label(bars, [f"{r['ratio_median']:.2f}× {REFERENCE}" for r in results][::-1], padding=3)
    ax.set_xlabel("median step() time (ms)")
    ax.set_title(f"one step() on {cfg.model} ({params['elements'] / 1e6:.1f} M parameters), "
                 f"{cfg.threads} thread(s)")
    ax.margins(x=0.2)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
