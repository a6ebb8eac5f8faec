"""Datasets by name, CIFAR augmentation and the global-batch sampler for data-parallel training."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scalesgd.data import cifar10, digits
from scalesgd.data.augment import random_crop_flip
from scalesgd.data.cifar10 import check_cifar10_dir, load_cifar10_bundle
from scalesgd.data.dataset import DataBundle, DataError, Split
from scalesgd.data.digits import load_digits_bundle
from scalesgd.data.sampler import GlobalBatchSampler
from scalesgd.data.synthetic import load_synthetic_bundle, synthetic_bytes
from scalesgd.registry import Registry


@dataclass(frozen=True)
class Dataset:
    """A dataset's loader, and what is known of it before loading."""

    load: Callable[[str | None, int, int, int], DataBundle]  # (data_dir, samples, image_size, classes)
    train_size: Callable[[int], int]  # the training-set size, given the `samples` option
    check_dir: Callable[[str | Path], object] | None = None  # raises DataError unless data_dir holds it
    files: str = ""  # what its data_dir holds, for messages
    memory: Callable[[int, int, int], int] | None = None  # bytes a process holds: (samples, image_size, classes)


DATASETS: Registry[Dataset] = Registry("dataset")
DATASETS.add("digits", Dataset(lambda data_dir, samples, image_size, classes: load_digits_bundle(),
                               lambda samples: digits.TRAIN_SIZE))
DATASETS.add("synthetic", Dataset(lambda data_dir, samples, image_size, classes: load_synthetic_bundle(
                                      samples=samples, image_size=image_size, num_classes=classes),
                                  lambda samples: samples, memory=synthetic_bytes))
DATASETS.add("cifar10", Dataset(lambda data_dir, samples, image_size, classes: load_cifar10_bundle(data_dir),
                                lambda samples: cifar10.TRAIN_SIZE, check_cifar10_dir,
                                f"{cifar10.FOLDER_NAME}/"))


def load_bundle(name: str, *, data_dir: str | Path | None = None, samples: int = 5000, image_size: int = 32,
                num_classes: int = 10) -> DataBundle:
    """Load a registered dataset; `samples`, `image_size` and `num_classes` shape the synthetic task only,
    and `data_dir` is where a dataset with files (cifar10) lies."""
    dataset = DATASETS[name]
    if dataset.check_dir is not None and data_dir is None:
        raise DataError(f"dataset {name!r} needs data_dir: the folder that is, or contains, {dataset.files}")
    return dataset.load(data_dir, samples, image_size, num_classes)


__all__ = ["DATASETS", "DataBundle", "DataError", "Dataset", "GlobalBatchSampler", "Split", "check_cifar10_dir",
           "load_bundle", "load_cifar10_bundle", "load_digits_bundle", "load_synthetic_bundle", "random_crop_flip",
           "synthetic_bytes"]
