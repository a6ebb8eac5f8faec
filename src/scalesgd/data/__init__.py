"""Datasets by name (images in memory or streamed from an ImageNet-layout folder, and byte-level text for language
models), their augmentation, the global-batch sampler for data-parallel training and the pipeline that feeds a step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from scalesgd.data import cifar10, digits
from scalesgd.data.augment import random_crop_flip
from scalesgd.data.cifar10 import check_cifar10_dir, load_cifar10_bundle
from scalesgd.data.dataset import DataBundle, DataError, Split
from scalesgd.data.digits import load_digits_bundle
from scalesgd.data.imagefolder.files import FolderData, load_image_folder
from scalesgd.data.imagefolder.scan import BadImage, check_image_folder, count_train_images
from scalesgd.data.pipeline import LoaderSettings, default_loader_workers, open_pipeline
from scalesgd.data.sampler import GlobalBatchSampler
from scalesgd.data.synthetic import load_synthetic_bundle, synthetic_bytes
from scalesgd.data.text import check_text_file, load_text_bundle, text_train_size
from scalesgd.registry import Registry


@dataclass(frozen=True)
class DataRequest:
    """What a run asks of a dataset: where its files are, and the sizes of the generated and cut ones."""

    data_dir: str | Path | None = None  # a dataset folder (cifar10, imagefolder)
    data_file: str | Path | None = None  # a user's text (text); None: the default corpus
    samples: int = 5000  # synthetic: training samples; text: training sequences at most
    image_size: int = 32  # synthetic: image side; imagefolder: the side images are cropped to
    num_classes: int = 10  # synthetic: classes
    sequence_length: int = 64  # text: tokens per sequence (the model's context)
    augment: bool = True  # the dataset's training augmentation (cifar10: pad and crop; imagefolder: resized crop)
    skip_bad_images: bool = False  # imagefolder: leave out (and count) files that cannot be decoded
    seed: int = 0  # imagefolder: seeds each sample's random crop and flip, with the epoch


@dataclass(frozen=True)
class Dataset:
    """A dataset's loader, and what is known of it before loading."""

    load: Callable[[DataRequest], DataBundle]
    train_size: Callable[[DataRequest], int]  # the training-set size, known without loading
    check_dir: Callable[[str | Path], object] | None = None  # raises DataError unless data_dir holds it
    files: str = ""  # what its data_dir holds, for messages
    memory: Callable[[DataRequest], int] | None = None  # bytes a process holds
    text: bool = False  # token sequences (a language model's), not images
    image_size: int = 0  # the image side it takes when the run gives none (0: its images' own)


DATASETS: Registry[Dataset] = Registry("dataset")
DATASETS.add("digits", Dataset(lambda r: load_digits_bundle(), lambda r: digits.TRAIN_SIZE))
DATASETS.add("synthetic", Dataset(lambda r: load_synthetic_bundle(samples=r.samples, image_size=r.image_size,
                                                                  num_classes=r.num_classes),
                                  lambda r: r.samples, image_size=32,
                                  memory=lambda r: synthetic_bytes(r.samples, r.image_size, r.num_classes)))
DATASETS.add("cifar10", Dataset(lambda r: load_cifar10_bundle(r.data_dir), lambda r: cifar10.TRAIN_SIZE,
                                check_cifar10_dir, f"{cifar10.FOLDER_NAME}/"))
DATASETS.add("imagefolder", Dataset(lambda r: load_image_folder(r.data_dir, r.image_size, r.augment, r.seed,
                                                                  r.skip_bad_images),
                                    lambda r: count_train_images(r.data_dir), check_image_folder,
                                    "train/<class>/* and val/<class>/* images (the ImageNet layout)", image_size=224))
DATASETS.add("text", Dataset(lambda r: load_text_bundle(r.data_file, r.sequence_length, samples=r.samples),
                             lambda r: text_train_size(r.data_file, r.sequence_length, samples=r.samples),
                             text=True))


def load_bundle(name: str, **request) -> DataBundle | FolderData:
    """Load a registered dataset as `DataRequest(**request)` asks (`samples`, `image_size` and `num_classes` shape
    the synthetic task; `data_dir` is where a dataset with files lies, `data_file` a user's text; `augment` False
    turns its training augmentation off). An image folder comes back as files to stream, the rest in memory."""
    dataset, request = DATASETS[name], DataRequest(**request)
    if dataset.check_dir is not None and request.data_dir is None:
        raise DataError(f"dataset {name!r} needs data_dir: the folder that is, or contains, {dataset.files}")
    data = dataset.load(request)
    return replace(data, augment=False) if isinstance(data, DataBundle) and data.augment and not request.augment \
        else data


__all__ = ["DATASETS", "BadImage", "DataBundle", "DataError", "DataRequest", "Dataset", "FolderData",
           "GlobalBatchSampler", "LoaderSettings", "Split", "check_cifar10_dir", "check_image_folder",
           "check_text_file", "default_loader_workers", "load_bundle", "load_cifar10_bundle", "load_digits_bundle", "load_image_folder",
           "load_synthetic_bundle", "load_text_bundle", "open_pipeline", "random_crop_flip", "synthetic_bytes"]
