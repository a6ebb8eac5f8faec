"""Datasets by name (images, and byte-level text for language models), CIFAR augmentation and the global-batch
sampler for data-parallel training."""

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
from scalesgd.data.text import check_text_file, load_text_bundle, text_train_size
from scalesgd.registry import Registry


@dataclass(frozen=True)
class DataRequest:
    """What a run asks of a dataset: where its files are, and the sizes of the generated and cut ones."""

    data_dir: str | Path | None = None  # a dataset folder (cifar10)
    data_file: str | Path | None = None  # a user's text (text); None: the default corpus
    samples: int = 5000  # synthetic: training samples; text: training sequences at most
    image_size: int = 32  # synthetic: image side
    num_classes: int = 10  # synthetic: classes
    sequence_length: int = 64  # text: tokens per sequence (the model's context)


@dataclass(frozen=True)
class Dataset:
    """A dataset's loader, and what is known of it before loading."""

    load: Callable[[DataRequest], DataBundle]
    train_size: Callable[[DataRequest], int]  # the training-set size, known without loading
    check_dir: Callable[[str | Path], object] | None = None  # raises DataError unless data_dir holds it
    files: str = ""  # what its data_dir holds, for messages
    memory: Callable[[DataRequest], int] | None = None  # bytes a process holds
    text: bool = False  # token sequences (a language model's), not images


DATASETS: Registry[Dataset] = Registry("dataset")
DATASETS.add("digits", Dataset(lambda r: load_digits_bundle(), lambda r: digits.TRAIN_SIZE))
DATASETS.add("synthetic", Dataset(lambda r: load_synthetic_bundle(samples=r.samples, image_size=r.image_size,
                                                                  num_classes=r.num_classes),
                                  lambda r: r.samples,
                                  memory=lambda r: synthetic_bytes(r.samples, r.image_size, r.num_classes)))
DATASETS.add("cifar10", Dataset(lambda r: load_cifar10_bundle(r.data_dir), lambda r: cifar10.TRAIN_SIZE,
                                check_cifar10_dir, f"{cifar10.FOLDER_NAME}/"))
DATASETS.add("text", Dataset(lambda r: load_text_bundle(r.data_file, r.sequence_length, samples=r.samples),
                             lambda r: text_train_size(r.data_file, r.sequence_length, samples=r.samples),
                             text=True))


def load_bundle(name: str, **request) -> DataBundle:
    """Load a registered dataset as `DataRequest(**request)` asks (`samples`, `image_size` and `num_classes` shape
    the synthetic task; `data_dir` is where a dataset with files lies, `data_file` a user's text)."""
    dataset, request = DATASETS[name], DataRequest(**request)
    if dataset.check_dir is not None and request.data_dir is None:
        raise DataError(f"dataset {name!r} needs data_dir: the folder that is, or contains, {dataset.files}")
    return dataset.load(request)


__all__ = ["DATASETS", "DataBundle", "DataError", "DataRequest", "Dataset", "GlobalBatchSampler", "Split",
           "check_cifar10_dir", "check_text_file", "load_bundle", "load_cifar10_bundle", "load_digits_bundle",
           "load_synthetic_bundle", "load_text_bundle", "random_crop_flip", "synthetic_bytes"]
