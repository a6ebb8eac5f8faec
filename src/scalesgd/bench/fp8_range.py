"""`scalesgd bench fp8-range`: what fp8's range settings cost on real gradients, to choose its defaults by
measurement. For each model, gradients are taken at several steps of training on the synthetic task; each
tensor is encoded as one rank encodes it (relative data, its sampled Q-quantile × headroom mapped to the top
of e5m2) and decoded; the table gives the relative L2 error of the whole decoded gradient and the fractions
of elements clipped at the top and flushed to zero."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from scalesgd import checks, output
from scalesgd.comm.codecs.fp8 import kernels as fp8
from scalesgd.comm.codecs.fp8.ranges import Fp8Options, sample_quantiles
from scalesgd.data import load_synthetic_bundle
from scalesgd.models import MODELS, build_model
from scalesgd.options import Options, floats_of, ints, option, words
from scalesgd.recipe import build_sgd, initialize


@dataclass
class Fp8RangeBenchConfig(Options):
    """`scalesgd bench fp8-range`: every quantile × headroom on the same recorded gradients."""

    models: tuple[str, ...] = option(("resnet20", "vgg16"), "networks whose gradients are encoded", choices=MODELS,
                                     parse=words, check=checks.distinct)
    quantiles: tuple[float, ...] = option((0.95, 0.99, 0.999, 1.0),
                                          "quantiles of |data| tried (1: the sampled maximum)",
                                          parse=floats_of("quantiles"),
                                          check=lambda v: checks.distinct(v) or (
                                              None if all(0 < q <= 1 for q in v) else "give each in (0, 1]"))
    headrooms: tuple[float, ...] = option((1.0, 2.0, 4.0, 8.0, 16.0), "headroom·q maps to the top of e5m2",
                                          parse=floats_of("headrooms"),
                                          check=lambda v: checks.distinct(v) or (
                                              None if all(h >= 1 for h in v) else "give each >= 1"))
    steps: tuple[int, ...] = option((1, 10, 50, 100), "training steps at which gradients are taken", parse=ints,
                                    check=lambda v: checks.distinct(v) or (None if min(v) >= 1 else "give steps >= 1"))
    batch_size: int = option(32, "samples per SGD step that makes the gradients", check=checks.positive)
    samples: int = option(1024, "elements sampled per tensor for its quantile, as training does",
                          check=checks.positive)
    threads: int = option(2, "compute threads", check=checks.threads(1))
    out: str = option("", "output directory", shown_default="runs/bench/fp8-range-<timestamp>",
                      check=checks.output_dir)


def run(cfg: Fp8RangeBenchConfig, command: str) -> int:
    torch.set_num_threads(cfg.threads)
    results = []
    for name in cfg.models:
        for step, grads, weights in recorded_gradients(name, cfg):
            for q in cfg.quantiles:
                for h in cfg.headrooms:
                    results.append({"model": name, "step": step, "quantile": q, "headroom": h,
                                    **measure(grads, weights, Fp8Options(quantile=q, samples=cfg.samples,
                                                                         headroom=h), step)})
    report(cfg, results, command)
    return 0


def recorded_gradients(name: str, cfg: Fp8RangeBenchConfig):
    """(step, gradients, weights) at each of `cfg.steps` of SGD on the synthetic task, one process."""
    torch.manual_seed(0)
    data = load_synthetic_bundle(samples=cfg.batch_size * 20, image_size=32, num_classes=10)
    model = initialize(build_model(name, data.num_classes, data.in_channels))
    optimizer = build_sgd(model, 0.05, 0.9, False, 1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(1, max(cfg.steps) + 1):
        idx = torch.randint(len(data.train), (cfg.batch_size,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(data.train.x[idx]), data.train.y[idx]).backward()
        if step in cfg.steps:
            yield step, [p.grad.detach().clone() for p in params], [p.detach().clone() for p in params]
        optimizer.step()


def measure(grads: list[torch.Tensor], weights: list[torch.Tensor], options: Fp8Options, step: int) -> dict:
    """One rank's encode → decode of every tensor under `options`; the error and what was lost."""
    gen = torch.Generator().manual_seed(step)
    error_sq = total_sq = clipped = flushed = elements = 0.0
    errors = []
    for g, w in zip(grads, weights):
        g, w = g.reshape(-1), w.reshape(-1)
        q = float(sample_quantiles(g, w, [0], [g.numel()], options, gen)[0])
        d_max = float((g.abs() / (w.abs() + options.eps)).max())
        q = q if q > 0 else (d_max if d_max > 0 else 1.0)  # as the codec: a zero range is not a range
        scale = torch.tensor(fp8.MAX / (options.headroom * q))
        back = fp8.decode_relative(fp8.encode_relative(g, w, options.eps, scale), w, options.eps, scale)
        err, norm = float((back - g).square().sum()), float(g.square().sum())
        error_sq, total_sq = error_sq + err, total_sq + norm
        if norm > 0:
            errors.append((err / norm) ** 0.5)
        clipped += float(fp8.clipped(g, scale, w, options.eps).sum())
        flushed += float(((back == 0) & (g != 0)).sum())
        elements += g.numel()
    return {"relative_error": (error_sq / total_sq) ** 0.5, "median_tensor_error": statistics.median(errors),
            "worst_tensor_error": max(errors), "clipped": clipped / elements, "flushed": flushed / elements}


def summarize(results: list[dict]) -> list[dict]:
    """Per (Q, headroom): the median and the worst over models and steps."""
    keys = sorted({(r["quantile"], r["headroom"]) for r in results})
    rows = []
    for q, h in keys:
        mine = [r for r in results if (r["quantile"], r["headroom"]) == (q, h)]
        rows.append({"quantile": q, "headroom": h,
                     **{f"median_{k}": statistics.median(r[k] for r in mine) for k in
                        ("relative_error", "worst_tensor_error", "clipped", "flushed")},
                     "max_relative_error": max(r["relative_error"] for r in mine)})
    return rows


def report(cfg: Fp8RangeBenchConfig, results: list[dict], command: str) -> None:
    rows = summarize(results)
    best = min(rows, key=lambda r: (r["max_relative_error"], r["median_relative_error"]))
    columns = ["Q", "headroom", "rel. L2 error, median (max)", "worst tensor's error, median", "clipped %",
               "flushed %", ""]
    table = [[f"{r['quantile']:g}", f"{r['headroom']:g}",
              f"{r['median_relative_error']:.4f} ({r['max_relative_error']:.4f})",
              f"{r['median_worst_tensor_error']:.4f}", f"{100 * r['median_clipped']:.3f}",
              f"{100 * r['median_flushed']:.4f}", "best" if r is best else ""] for r in rows]
    out = Path(cfg.out)
    output.write(out, "fp8-range", {"config": cfg.to_dict(), "summary": rows, "results": results}, columns, table,
                 command)
    plot(out / "fp8-range.png", cfg, rows)
    output.console().print(output.rich_table(f"fp8 range settings on {', '.join(cfg.models)} gradients at steps "
                                      f"{','.join(map(str, cfg.steps))}", columns, table))
    output.console().print(f"written to {out}/fp8-range.{{json,md,png}}", highlight=False)


def plot(path: Path, cfg: Fp8RangeBenchConfig, rows: list[dict]) -> None:
    plt = output.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for q in cfg.quantiles:
        mine = [r for r in rows if r["quantile"] == q]
        ax.plot([r["headroom"] for r in mine], [r["median_relative_error"] for r in mine], "o-", label=f"Q = {q:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("headroom")
    ax.set_ylabel("relative L2 error of the decoded gradient (median)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
