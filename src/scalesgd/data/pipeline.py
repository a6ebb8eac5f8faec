"""What the training loop reads: each step's micro-batches on the device, the test set in shards, a few fixed
batches for the planner's probes — from tensors in memory, or streamed from an image folder.

The folder path does what the best ImageNet loaders do without torchvision: files decoded in DataLoader worker
processes that persist across epochs, batches prefetched and pinned, uint8 pixels sent and normalised on the device
(as NVIDIA's and FFCV's loaders do), and the global-batch sampler's one shuffle per epoch driving the order, so a
run resumed mid-epoch reads exactly the batches the uninterrupted one would have.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import torch

from scalesgd.data.augment import random_crop_flip
from scalesgd.data.dataset import DataBundle, DataError, Split
from scalesgd.data.imagefolder.files import FolderData, check_batch, collate
from scalesgd.data.sampler import GlobalBatchSampler

PREFETCH = 2  # batches each loader worker decodes ahead (PyTorch's default)
MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]
# what torch's DataLoader raises (from its SIGCHLD handler, anywhere in the main thread, or when it next reads) when
# one of its processes died: "DataLoader worker (pid 12) is killed by signal: Killed.", "… (pid(s) 12) exited
# unexpectedly", "… (pid 12) exited unexpectedly with exit code 1. Details are lost …"
LOADER_DIED = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (is killed by signal: ([^.]+)|exited "
                         r"unexpectedly with exit code (-?\d+)|exited unexpectedly)")
SIGNAL_NAMES = {signal.strsignal(s): s.name for s in signal.Signals}  # "Killed" -> "SIGKILL"
PR_SET_PDEATHSIG = 1


class DataGone(DataError):
    """Files the run was reading are gone (their folder removed or renamed mid-run): not a bad file, and no restart
    finds them until they are put back."""


class LoaderDied(RuntimeError):
    """A data loader process died (the OOM killer, a kill by hand): the message says which and how."""


def loader_death(err: BaseException) -> str | None:
    """What an error says of a loader process that died (the OOM killer, a kill by hand), in one line; None for
    any other error."""
    if isinstance(err, LoaderDied):
        return str(err)
    found = LOADER_DIED.search(str(err)) if isinstance(err, RuntimeError) else None
    if found is None:
        return None
    pids, _, killed_by, status = found.groups()
    if killed_by is not None:
        how = f"was killed by {SIGNAL_NAMES.get(killed_by.strip(), killed_by.strip())}"
    else:
        how = f"exited with status {status}" if status is not None else "exited unexpectedly"
    return f"data loader process (pid {pids.strip()}) {how}"


def vanished(paths: list[str]) -> Path | None:
    """The outermost missing folder (or file) of the first of `paths` that no longer exists, or None."""
    for path in map(Path, paths):
        if not path.exists():
            while path.parent != path and not path.parent.exists():
                path = path.parent
            return path
    return None


def gone(paths: list[str]) -> DataGone | None:
    """DataGone naming what of `paths` is gone, or None while they are all there."""
    missing = vanished(paths)
    return None if missing is None else DataGone(f"{missing} is gone (removed or renamed while the run read it)")


def one_line(err: DataError) -> DataError:
    """A data error raised in a loader process, as the loader re-raises it ("Caught BadImage in DataLoader worker
    process 0." and the traceback), back to its own last line."""
    text = str(err).strip()
    if text.startswith("Caught "):  # torch's re-raise: the traceback's last line is the original "module.Type: …"
        text = re.sub(r"^[\w.]+: ", "", text.splitlines()[-1])
    return type(err)(text)


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
            yield self.batch(indices)

    def batch(self, indices: list[int]) -> MicroBatches:
        """These training samples, in the step's micro-batches (augmented where the data is)."""
        parts = []
        for part in torch.tensor(indices).chunk(self.accumulate):
            x = self.data.train.x[part]
            if self.data.augment:
                x = random_crop_flip(x)
            parts.append((x.to(self.device, non_blocking=True),
                          self.data.train.y[part].to(self.device, non_blocking=True)))
        return parts

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
        self.root = Path(os.path.commonpath([data.train.files[0][0], data.test.files[0][0]]))  # the folder read

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
        for batch in self.read(batches):
            x, y = self.on_device(batch)
            yield list(zip(x.chunk(self.accumulate), y.chunk(self.accumulate)))

    def test_batches(self, rank: int, world: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's strided shard of the validation folder (the shard was fixed when the loader was built)."""
        for batch in self.read(iter(self.test)):
            yield self.on_device(batch)

    def read(self, batches: Iterator) -> Iterator:
        """The loader's batches; an error a loader process raised comes back as one line, not its traceback."""
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except DataError as err:
                raise (gone([str(self.root)]) or one_line(err)) from None
            except Exception:  # a loader process killed mid-batch: its socket's EOF may come before torch's own check
                died = self.dead_loader()
                if died is None:
                    raise
                raise LoaderDied(died) from None
            yield batch

    def dead_loader(self, wait_s: float = 1.0) -> str | None:
        """Which loader process died, and how, in one line; None when all are alive after `wait_s` (a killed one
        closes its sockets a moment before it is seen to have ended)."""
        processes = [w for source in (self.train, self.test)
                     for w in getattr(getattr(source, "_iterator", None), "_workers", [])]
        end = time.monotonic() + wait_s
        while True:
            for w in processes:
                if w.exitcode is not None:
                    how = (f"was killed by {signal.Signals(-w.exitcode).name}" if w.exitcode < 0
                           else f"exited with status {w.exitcode}")
                    return f"data loader process (pid {w.pid}) {how}"
            if time.monotonic() > end:
                return None
            time.sleep(0.05)

    def first_batches(self, size: int, count: int) -> MicroBatches:
        """The training set's first `count` batches of `size`, decoded in this process (epoch 0's crops)."""
        batches = []
        for i in torch.arange(len(self.data.train)).split(size)[:count]:
            batches.append(self.on_device(collate([self.data.train[(0, j)] for j in i.tolist()])))
        return batches

    def on_device(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels and labels on the device, the pixels normalised there; a bad file is reported (or skipped, once),
        a file gone since the run began is DataGone (the folder removed or renamed: the run cannot go on; with
        `skip_bad`, one file gone is skipped as a bad one is, the folder gone is DataGone)."""
        if batch.problems:
            read = [p.partition(": ")[0] for joined in batch.problems for p in joined.split("; ")]
            missing = gone([str(self.root)] + ([] if self.settings.skip_bad else read))
            if missing is not None:
                raise missing
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
        persistent_workers=workers > 0, prefetch_factor=PREFETCH if workers > 0 else None,
        worker_init_fn=functools.partial(end_with_trainer, os.getpid()) if workers > 0 else None, **batching)


def end_with_trainer(trainer: int, _worker_id: int) -> None:
    """In a loader process: end the moment the training process does, however it ends (Linux's parent-death signal),
    not at torch's next check seconds later, holding the run's output open and reading for nobody meanwhile."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != trainer:  # it ended before the signal was asked for
        os._exit(0)


def open_pipeline(data: DataBundle | FolderData, sampler: GlobalBatchSampler, accumulate: int,
                  settings: LoaderSettings, rank: int = 0, world: int = 1) -> MemoryPipeline | FolderPipeline:
    """The pipeline that feeds `data` to one rank."""
    if isinstance(data, FolderData):
        return FolderPipeline(data, sampler, accumulate, settings, rank, world)
    return MemoryPipeline(data, sampler, accumulate, settings.device, settings.eval_batch)
