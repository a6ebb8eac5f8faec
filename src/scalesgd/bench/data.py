"""`scalesgd bench data`: how fast an image folder is decoded and augmented, per loader worker and in total, beside
how fast the model's step consumes images — so, how many loader workers keep the step fed.

Honda et al. 2019 ("Yet Another Accelerated SGD: ResNet-50 Training on ImageNet in 74.7 seconds") moved decoding
onto DALI because the step outran the input pipeline; this measures whether ours keeps up, and projects the
workers an accelerator's step would need from the simulator's published ResNet-50 rate.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from scalesgd import checks, output
from scalesgd.data import DataError, GlobalBatchSampler, LoaderSettings, check_image_folder, load_image_folder
from scalesgd.data.config import image_side
from scalesgd.data.pipeline import PREFETCH, loader
from scalesgd.errors import UsageError
from scalesgd.models import MODELS, build_model
from scalesgd.options import Options, option
from scalesgd.sim.presets import V100_IMAGES_PER_S
from scalesgd.trace import synchronize


def _counts(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


@dataclass
class DataBenchConfig(Options):
    """`scalesgd bench data`: images/s through the folder pipeline for each loader-worker count, and the model's."""

    data_dir: str = option("", "an image folder (DIR/train/<class>/*): `scalesgd data fake` writes one",
                           required=True)
    image_size: int = option(224, "the side images are cropped to", check=image_side)
    augment: str = option("standard", "standard: random-resized crop and flip (training's); none: resize and "
                          "centre crop", choices=("standard", "none"))
    loader_workers: tuple[int, ...] = option((0, 1, 2), "loader processes to measure, each in turn (0: decoding in "
                                             "the measuring process)", parse=_counts, check=checks.distinct)
    batch: int = option(32, "images per batch (one worker's step)", check=checks.positive)
    batches: int = option(6, "timed batches per round for each loader worker, after the batches the workers "
                          "decoded ahead are taken untimed", check=checks.positive)
    rounds: int = option(3, "rounds; the loader-worker counts take turns", check=checks.positive)
    model: str = option("resnet50", "the network whose step is timed beside the pipeline (none: skip)",
                        choices=lambda: ("none", *MODELS))
    steps: int = option(3, "timed training steps of the model, after one untimed", check=checks.positive)
    threads: int = option(0, "compute threads for the model's step", shown_default="all cores",
                          check=checks.threads(0, "0: all cores"))
    device: str = option("auto", "where the model's step runs (auto: the GPU where one is present)",
                         choices=checks.DEVICES, check=checks.device)
    precision: str = option("fp32", "the model step's arithmetic: fp32, or autocast to bf16 as training's "
                            "--precision bf16", choices=("fp32", "bf16"))
    step_rate: float = option(float(V100_IMAGES_PER_S), "images/s one accelerator's step consumes, for the "
                              "projection of loader workers it needs", shown_default="the simulator's published "
                              "ResNet-50 rate on one V100, 1376", check=checks.positive)
    out: str = option("", "output directory", shown_default="runs/bench/data-<timestamp>", check=checks.output_dir)

    def validate(self) -> DataBenchConfig:
        super().validate()
        if any(n < 0 for n in self.loader_workers):
            raise UsageError(f"`loader_workers` {','.join(map(str, self.loader_workers))}: each must be >= 0")
        try:
            check_image_folder(self.data_dir)
        except DataError as err:
            raise UsageError(f"`data_dir` {self.data_dir}: {err}") from None
        return self


def run(cfg: DataBenchConfig, command: str) -> int:
    """Time the pipeline for each loader-worker count, then the model's step; report how many workers it needs."""
    data = load_image_folder(cfg.data_dir, cfg.image_size, cfg.augment == "standard")
    if len(data.train) < cfg.batch:
        raise UsageError(f"`batch` {cfg.batch} is larger than the folder's {len(data.train)} training images")
    pipeline = {n: pipeline_rates(data.train, n, cfg) for n in cfg.loader_workers}
    rows = [{"loader_workers": n, "images_per_s": rates,
             "per_worker": [r / max(n, 1) for r in rates]} for n, rates in pipeline.items()]
    step = model_rate(cfg, data) if cfg.model != "none" else None
    per_worker = best_per_worker(rows)
    measured = {"images": {"train": len(data.train), "channels": data.in_channels}, "pipeline": rows,
                "model_images_per_s": step, "model_device": checks.device_name(cfg.device),
                "per_loader_worker_images_per_s": per_worker,
                "workers_needed_here": needed(step, per_worker), "step_rate_projected": cfg.step_rate,
                "workers_needed_projected": needed(cfg.step_rate, per_worker)}
    report(cfg, measured, command)
    return 0


def best_per_worker(rows: list[dict]) -> float | None:
    """Images/s one loader process decodes: the median over rounds at the fewest workers measured (more workers
    share the cores, so their per-worker rate says less)."""
    with_workers = [row for row in rows if row["loader_workers"] > 0] or rows
    if not with_workers:
        return None
    fewest = min(with_workers, key=lambda row: row["loader_workers"])
    return statistics.median(fewest["per_worker"])


def needed(rate: float | None, per_worker: float | None) -> int | None:
    """Loader processes that decode `rate` images/s."""
    if not rate or not per_worker:
        return None
    return math.ceil(rate / per_worker)


def pipeline_rates(files, workers: int, cfg: DataBenchConfig) -> list[float]:
    """Images/s out of a DataLoader with `workers` processes, one value per round (fresh processes each round).

    The batches the workers decode ahead (PREFETCH each) are taken before the clock starts: timed while they were
    waiting, 8 workers on an H200's host read 55,000 images/s for 355 per worker. Each worker then makes `batches`
    batches on the clock, epochs following one another without a pause, so the rate is the workers' steady output."""
    sampler = GlobalBatchSampler(len(files), cfg.batch, 1, 0, min_per_rank=1)
    rates = []
    for round_ in range(cfg.rounds):
        batches = loader(files, LoaderSettings(workers, torch.device("cpu")),
                         batch_sampler=EndlessBatches(sampler, first_epoch=round_ * 1000))
        it = iter(batches)
        for _ in range(max(1, workers * PREFETCH)):  # processes started, what they decoded ahead taken
            next(it)
        start, images = time.perf_counter(), 0
        for _ in range(cfg.batches * max(1, workers)):
            images += len(next(it).y)
        rates.append(images / (time.perf_counter() - start))
        del it, batches
    return rates


class EndlessBatches(torch.utils.data.Sampler):
    """Epoch after epoch of the sampler's batches, as one stream: the loader never drains at an epoch's end (a small
    folder has few batches an epoch, and each new epoch would leave the workers idle until it began)."""

    def __init__(self, sampler: GlobalBatchSampler, first_epoch: int = 0) -> None:
        self.sampler, self.first_epoch = sampler, first_epoch

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for epoch in itertools.count(self.first_epoch):
            self.sampler.set_epoch(epoch)
            for indices in self.sampler:
                yield [(epoch, i) for i in indices]


def model_rate(cfg: DataBenchConfig, data) -> float:
    """Images/s of the model's training step (forward, backward, SGD) on `--device`, median of `steps`."""
    torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    device = checks.resolve_device(cfg.device)
    model = build_model(cfg.model, data.num_classes, data.in_channels).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(cfg.batch, data.in_channels, cfg.image_size, cfg.image_size, device=device)
    y = torch.randint(0, data.num_classes, (cfg.batch,), device=device)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=cfg.precision == "bf16")
    times = []
    for i in range(cfg.steps + 1):
        synchronize(device)
        start = time.perf_counter()
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return cfg.batch / statistics.median(times)


def report(cfg: DataBenchConfig, measured: dict, command: str) -> None:
    """The table, pipeline.{json,md}, and the workers the step needs."""
    columns = ["loader workers", "images/s (median)", "min–max", "per worker (median)"]
    rows = [[str(r["loader_workers"]) + (" (in process)" if r["loader_workers"] == 0 else ""),
             f"{statistics.median(r['images_per_s']):.1f}",
             f"{min(r['images_per_s']):.1f}–{max(r['images_per_s']):.1f}",
             f"{statistics.median(r['per_worker']):.1f}"] for r in measured["pipeline"]]
    out = Path(cfg.out)
    output.write(out, "data", {"config": cfg.to_dict(), **measured}, columns, rows, command)
    console = output.console()
    console.print(output.rich_table(f"{cfg.data_dir}: decoded and augmented ({cfg.augment}) to {cfg.image_size} px, "
                                    f"batches of {cfg.batch}, {cfg.rounds} rounds", columns, rows))
    step, here, projected = (measured["model_images_per_s"], measured["workers_needed_here"],
                             measured["workers_needed_projected"])
    if step is not None:
        console.print(f"{cfg.model}'s step ({cfg.precision}, {measured['model_device']}): {step:.1f} images/s → "
                      f"{here} loader worker(s) keep it fed",
                      highlight=False)
    if projected is not None:
        console.print(f"projection: a step consuming {cfg.step_rate:,.0f} images/s needs {projected} loader "
                      f"worker(s) of this machine's speed", highlight=False)
    console.print(f"written to {out}/data.{{json,md}}", highlight=False)
