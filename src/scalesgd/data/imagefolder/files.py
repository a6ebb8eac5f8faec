"""A split of an image folder as a `torch.utils.data.Dataset`: each file decoded with Pillow and transformed when a
batch asks for it, in a DataLoader worker process; uint8 pixels travel, normalisation happens on the device.

A sample's random crop and flip come from a generator seeded by (seed, epoch, index), so a batch is the same
whichever loader worker decodes it, however many there are, and after a resume mid-epoch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image

from scalesgd.data.dataset import DataError
from scalesgd.data.imagefolder.scan import (
    GREY_MODES,
    SKIP_HINT,
    BadImage,
    index_image_folder,
)
from scalesgd.data.imagefolder.transforms import eval_image, plain_image, train_image

TRANSFORMS = ("train", "eval", "plain")  # random-resized crop and flip; resize to 256/224 and centre crop; as is
SUBSTITUTES = 16  # with skip_bad: the following files tried in place of a bad one, at most
STATS_SAMPLES = 256  # training images, evenly spaced, whose pixels give the per-channel mean and std


class Sample(NamedTuple):
    """One decoded image: pixels, label, its index in the split, and what was wrong with a file skipped for it."""

    x: torch.Tensor  # uint8 (C, H, W)
    y: int
    index: int
    problem: str  # "path: what is wrong", or ""


class Batch(NamedTuple):
    """Samples stacked: uint8 pixels, int64 labels, the split indices read, and the problems met."""

    x: torch.Tensor
    y: torch.Tensor
    indices: torch.Tensor
    problems: list[str]


class ImageFiles(torch.utils.data.Dataset):
    """(path, label) pairs decoded on access to `channels`×`size`×`size` uint8 tensors by `transform`."""

    def __init__(self, files: list[tuple[str, int]], channels: int, size: int, transform: str, seed: int = 0,
                 skip_bad: bool = False) -> None:
        if transform not in TRANSFORMS:
            raise ValueError(f"ImageFiles transform must be one of {TRANSFORMS}, got {transform!r}")
        self.files, self.channels, self.size, self.transform = files, channels, size, transform
        self.seed, self.skip_bad = seed, skip_bad
        self.mode = "L" if channels == 1 else "RGB"

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: int | tuple[int, int]) -> Sample:
        """The sample at `index` (or `(epoch, index)`: the epoch picks the random crop); with `skip_bad`, a file that
        cannot be decoded is replaced by the next one that can."""
        epoch, index = key if isinstance(key, tuple) else (0, key)
        problems = []
        for offset in range(SUBSTITUTES if self.skip_bad else 1):
            path, label = self.files[(index + offset) % len(self.files)]
            try:
                return Sample(self.decode(path, epoch, index), label, index, "; ".join(problems))
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
                problems.append(f"{path}: cannot be decoded ({err})")
        if self.skip_bad:
            raise BadImage(f"{SUBSTITUTES} files in a row from {self.files[index][0]} cannot be decoded")
        return Sample(torch.zeros(self.channels, self.size, self.size, dtype=torch.uint8), -1, index, problems[0])

    def decode(self, path: str, epoch: int, index: int) -> torch.Tensor:
        """The file's pixels after this split's transform (raises what Pillow raises for a bad file; an image over its
        pixel limit was named by the pre-scan, so Pillow's own warning is not repeated at every read)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                if self.transform == "train":
                    generator = torch.Generator().manual_seed(sample_seed(self.seed, epoch, index))
                    return train_image(converted(image, self.mode), self.size, generator)
                if self.transform == "eval":
                    return eval_image(converted(image, self.mode), self.size)
                return plain_image(converted(image, self.mode), self.size)


def converted(image: Image.Image, mode: str) -> Image.Image:
    """The image in `mode` ('L' or 'RGB'), left lazy where it already is (a JPEG can then still be decoded reduced)."""
    if image.mode == mode:
        return image
    if mode == "RGB" and image.mode in GREY_MODES + ("P", "PA", "RGBA", "CMYK", "YCbCr"):
        return image.convert("RGB")
    return image.convert(mode)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A generator seed for one sample's augmentation in one epoch, mixed so nearby triples differ."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


def collate(samples: list[Sample]) -> Batch:
    """Stack a batch (the DataLoader's collate_fn)."""
    return Batch(torch.stack([s.x for s in samples]), torch.tensor([s.y for s in samples], dtype=torch.int64),
                 torch.tensor([s.index for s in samples], dtype=torch.int64), [s.problem for s in samples if s.problem])


def check_batch(batch: Batch, skip_bad: bool) -> list[str]:
    """The problems a batch met, each "path: what" (with `skip_bad`, files already replaced); without it, the
    first one raises BadImage naming the file."""
    if batch.problems and not skip_bad:
        raise BadImage(f"{batch.problems[0]}; {SKIP_HINT}")
    return [p for joined in batch.problems for p in joined.split("; ")]


def channel_stats(files: ImageFiles, samples: int = STATS_SAMPLES) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of pixels in [0, 1] over up to `samples` evenly spaced images."""
    picks = np.unique(np.linspace(0, len(files) - 1, min(samples, len(files))).round().astype(int))
    total = torch.zeros(files.channels, dtype=torch.float64)
    squares = torch.zeros_like(total)
    pixels = 0
    for i in picks.tolist():
        sample = files[i]
        if sample.y < 0:  # read by every rank alike: rank 0 says it
            raise DataError(f"{sample.problem}; {SKIP_HINT}")
        x = sample.x.to(torch.float64).div_(255).flatten(1)
        total += x.sum(1)
        squares += x.square().sum(1)
        pixels += x.shape[1]
    mean = total / pixels
    std = (squares / pixels - mean.square()).clamp_min(1e-12).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())


@dataclass(frozen=True)
class FolderData:
    """An image folder's splits, streamed: the in-memory `DataBundle`'s metadata beside files decoded on demand."""

    train: ImageFiles
    test: ImageFiles
    num_classes: int
    in_channels: int
    image_size: int
    mean: tuple[float, ...]  # per channel, of pixels in [0, 1], estimated from the training images
    std: tuple[float, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (path, what is wrong): files the pre-scan left out
    augment: bool = True
    sequence_length: int = 0
    is_text: bool = False
    large: tuple[tuple[str, int], ...] = ()  # (path, pixels): images read although over Pillow's pixel limit


def load_image_folder(data_dir: str | Path, image_size: int, augment: bool = True, seed: int = 0,
                      skip_bad: bool = False) -> FolderData:
    """The folder's splits, pre-scanned: training takes the random-resized crop and flip (`augment`) or the images
    as they are, evaluation the 256/224 resize and centre crop (or, without `augment`, the images as they are)."""
    index = index_image_folder(data_dir, skip_bad)
    index.warn_large()
    train = ImageFiles(index.train, index.channels, image_size, "train" if augment else "plain", seed, skip_bad)
    test = ImageFiles(index.val, index.channels, image_size, "eval" if augment else "plain", seed, skip_bad)
    mean, std = channel_stats(ImageFiles(index.train, index.channels, image_size, test.transform, seed, skip_bad))
    return FolderData(train, test, len(index.classes), index.channels, image_size, mean, std, tuple(index.bad),
                      augment, large=tuple(index.large))

