"""Small in-memory datasets, CIFAR augmentation and the global-batch sampler for data-parallel training."""

from __future__ import annotations

from pathlib import Path

from scalesgd.data.augment import random_crop_flip
from scalesgd.data.cifar10 import check_cifar10_dir, load_cifar10_bundle
from scalesgd.data.dataset import DataBundle, DataError, Split
from scalesgd.data.digits import load_digits_bundle
from scalesgd.data.sampler import GlobalBatchSampler
from scalesgd.data.synthetic import load_synthetic_bundle

DATASETS = ("digits", "synthetic", "cifar10")

__all__ = [
    "DATASETS",
    "DataBundle",
    "DataError",
    "GlobalBatchSampler",
    "Split",
    "check_cifar10_dir",
    "load_bundle",
    "load_cifar10_bundle",
    "load_digits_bundle",
    "load_synthetic_bundle",
    "random_crop_flip",
]


def load_bundle(
    name: str,
    *,
    data_dir: str | Path | None = None,
    samples: int = 5000,
    image_size: int = 32,
    num_classes: int = 10,
) -> DataBundle:
    """Load a dataset by name so callers (CLI, recipes) need not know each loader's signature.

    ``samples``, ``image_size`` and ``num_classes`` only shape the synthetic task;
    ``data_dir`` is required for, and only used by, ``cifar10``.
    """
    if name == "digits":
        return load_digits_bundle()
    if name == "synthetic":
        return load_synthetic_bundle(samples=samples, image_size=image_size, num_classes=num_classes)
    if name == "cifar10":
        if data_dir is None:
            raise DataError("dataset 'cifar10' needs data_dir: the folder that is, or contains, cifar-10-batches-py/")
        return load_cifar10_bundle(data_dir)
    raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
