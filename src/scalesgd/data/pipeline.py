"""What the training loop reads: each step's micro-batches on the device, the test set in shards, a few fixed
batches for the planner's probes — from tensors in memory, or streamed from an image folder.

The folder path does what the best ImageNet loaders do without torchvision: files decoded in DataLoader worker
processes that persist across epochs, batches prefetched and pinned, uint8 pixels sent and normalised on the device
(as NVIDIA's and FFCV's loaders do), and the global-batch sampler's one shuffle per epoch driving the order, so a
run resumed mid-epoch reads exactly the batches the uninterrupted one would have.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

import torch

from scalesgd.data.augment import random_crop_flip
from scalesgd.data.dataset import DataBundle, Split
from scalesgd.data.imagefolder.files import FolderData, check_batch, collate
from scalesgd.data.sampler import GlobalBatchSampler

PREFETCH = 2  # batches each loader worker decodes ahead (PyTorch's default)
MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]


def default_loader_workers(local_processes: int, cores: int | None = None) -> int:
    """Loader processes per training process: the cores the training processes leave free, shared out (at least 1)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, (cores - local_processes) // max(1, local_processes))


@dataclass(frozen=True)
class LoaderSettings:
    """How a folder is streamed: decoding processes per training process, and the device batches go to."""

    workers: int
    device: torch.device
    seed: int = 0
    skip_bad: bool = False
    eval_batch: int = 256


class EpochBatches(torch.utils.data.Sampler):
    """The sampler's steps from `start` on, each index paired with the epoch (it seeds the sample's random crop)."""

    def __init__(self, sampler: GlobalBatchSampler) -> None:
        self.sampler, self.start = sampler, 0

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for indices in islice(self.sampler, self.start, None):
            yield [(self.sampler.epoch, i) for i in indices]

    def __len__(self) -> int:
        return len(self.sampler) - self.start


class MemoryPipeline:
    """Batches cut from tensors held whole (CIFAR-10 takes its pad-and-crop augmentation per micro-batch)."""

    def __init__(self, data: DataBundle, sampler: GlobalBatchSampler, accumulate: int, device: torch.device,
                 eval_batch: int) -> None:
        self.data, self.sampler, self.accumulate = data, sampler, accumulate
        self.device, self.eval_batch = device, eval_batch
        self.skipped: dict[str, str] = {}

    def steps(self, start: int = 0) -> Iterator[MicroBatches]:
        """Each step's micro-batches from step `start` of the sampler's epoch."""
        for indices in islice(self.sampler, start, None):
            parts = []
            for part in torch.tensor(indices).chunk(self.accumulate):
                x = self.data.train.x[part]
                if self.data.augment:
                    x = random_crop_flip(x)
                parts.append((x.to(self.device, non_blocking=True),
                              self.data.train.y[part].to(self.device, non_blocking=True)))
            yield parts

    def test_batches(self, rank: int, world: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's strided shard of the test set, in batches of `eval_batch`."""
        split: Split = self.data.test
        for chunk in torch.arange(rank, len(split), world).split(self.eval_batch):
            yield split.x[chunk].to(self.device), split.y[chunk].to(self.device)

    def prepare(self, epoch: int) -> None:
        """Nothing to start ahead: batches are cut when asked for."""

    def first_batches(self, size: int, count: int) -> MicroBatches:
        """The training set's first `count` batches of `size`, in order, with no random draw."""
        return [(self.data.train.x[i].to(self.device), self.data.train.y[i].to(self.device))
                for i in torch.arange(len(self.data.train)).split(size)[:count]]

    def close(self) -> None:
        """Nothing to stop."""


class FolderPipeline:
    """Batches decoded from files by DataLoader worker processes, kept alive across epochs."""

    def __init__(self, data: FolderData, sampler: GlobalBatchSampler, accumulate: int, settings: LoaderSettings,
                 rank: int = 0, world: int = 1) -> None:
        self.data, self.accumulate, self.settings = data, accumulate, settings
        self.batches = EpochBatches(sampler)
        self.skipped: dict[str, str] = dict(data.skipped)  # path -> what is wrong, the pre-scan's first
        self.mean = torch.tensor(data.mean, device=settings.device).view(1, -1, 1, 1)
        self.std = torch.tensor(data.std, device=settings.device).view(1, -1, 1, 1)
        self.train = loader(data.train, settings, batch_sampler=self.batches)
        shard = torch.utils.data.Subset(data.test, range(rank, len(data.test), world))
        self.test = loader(shard, settings, batch_size=settings.eval_batch)
        self.started: tuple[int, Iterator] | None = None  # an epoch whose decoding began ahead of its first step

    def prepare(self, epoch: int) -> None:
        """Have the loader processes start decoding `epoch`'s first batches now (while the last epoch is evaluated):
        persistent workers otherwise sit idle until the epoch's first step asks, and that step waits for a whole
        batch (0.5 s of ResNet-50's 56 ms steps on an H200)."""
        self.batches.sampler.set_epoch(epoch)
        self.batches.start = 0
        self.started = (epoch, iter(self.train))

    def steps(self, start: int = 0) -> Iterator[MicroBatches]:
        """Each step's micro-batches from step `start` of the sampler's epoch, normalised on the device."""
        started, self.started = self.started, None
        if started is not None and started[0] == self.batches.sampler.epoch and start == 0:
            batches = started[1]
        else:
            self.batches.start = start
            batches = iter(self.train)
        for batch in batches:
            x, y = self.on_device(batch)
            yield list(zip(x.chunk(self.accumulate), y.chunk(self.accumulate)))

    def test_batches(self, rank: int, world: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's strided shard of the validation folder (the shard was fixed when the loader was built)."""
        for batch in self.test:
            yield self.on_device(batch)

    def first_batches(self, size: int, count: int) -> MicroBatches:
        """The training set's first `count` batches of `size`, decoded in this process (epoch 0's crops)."""
        batches = []
        for i in torch.arange(len(self.data.train)).split(size)[:count]:
            batches.append(self.on_device(collate([self.data.train[(0, j)] for j in i.tolist()])))
        return batches

    def on_device(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels and labels on the device, the pixels normalised there; a bad file is reported (or skipped, once)."""
        for problem in check_batch(batch, self.settings.skip_bad):
            path, _, what = problem.partition(": ")
            if path not in self.skipped:
                self.skipped[path] = what
                print(f"scalesgd: skipped {path}: {what}", file=sys.stderr)
        device = self.settings.device
        x = batch.x.to(device, non_blocking=True).float().div_(255).sub_(self.mean).div_(self.std)
        return x, batch.y.to(device, non_blocking=True)

    def close(self) -> None:
        """Stop the loader processes now, not when the loaders are collected (persistent workers outlive an epoch)."""
        for source in (self.train, self.test):
            shutdown = getattr(getattr(source, "_iterator", None), "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()


def loader(dataset, settings: LoaderSettings, **batching) -> torch.utils.data.DataLoader:
    """A DataLoader as ImageNet training wants one: worker processes that persist, prefetching, pinned batches."""
    workers = settings.workers
    return torch.utils.data.DataLoader(
        dataset, num_workers=workers, collate_fn=collate, pin_memory=settings.device.type == "cuda",
        persistent_workers=workers > 0, prefetch_factor=PREFETCH if workers > 0 else None, **batching)


def open_pipeline(data: DataBundle | FolderData, sampler: GlobalBatchSampler, accumulate: int,
                  settings: LoaderSettings, rank: int = 0, world: int = 1) -> MemoryPipeline | FolderPipeline:
    """The pipeline that feeds `data` to one rank."""
    if isinstance(data, FolderData):
        return FolderPipeline(data, sampler, accumulate, settings, rank, world)
    return MemoryPipeline(data, sampler, accumulate, settings.device, settings.eval_batch)
