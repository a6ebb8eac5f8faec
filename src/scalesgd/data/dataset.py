"""In-memory dataset containers shared by every loader, so training code sees one shape of data."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

import torch


class DataError(ValueError):
    """Bad or missing data on disk or in memory, reported as one line naming the culprit."""


def not_a_folder(path: Path, what: str, expected: str) -> DataError:
    """The error for a `what` (a dataset folder) at `path` that is no folder, saying what is there instead: nothing,
    a file, or a link that cannot be followed."""
    try:
        path.stat()
    except OSError as err:
        if path.is_symlink():
            return DataError(f"{what} {path} is a symbolic link that cannot be followed ({err.strerror}); expected "
                             f"{expected}")
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return DataError(f"{what} not found: {path} (expected {expected})")
        return DataError(f"{what} {path} cannot be read ({err.strerror}); expected {expected}")
    return DataError(f"{what} {path} is a file, not a folder (expected {expected})")


@dataclass(frozen=True, eq=False)
class Split:
    """One split kept as whole tensors: images with labels, or token sequences with next-token targets."""

    x: torch.Tensor  # float32 (N, C, H, W) images, or int64 (N, T) tokens
    y: torch.Tensor  # int64 (N,) labels, or int64 (N, T) next-token targets

    def __post_init__(self) -> None:
        if self.is_text:
            if not isinstance(self.y, torch.Tensor) or self.y.dtype != torch.int64 or self.y.shape != self.x.shape:
                raise DataError(
                    f"Split.y must be an int64 tensor of shape {tuple(self.x.shape)} (next-token targets for "
                    f"Split.x's token sequences), got {_describe(self.y)}"
                )
            if self.x.shape[1] < 1:
                raise DataError(f"Split.x token sequences must have length T >= 1, got {_describe(self.x)}")
            return
        if not isinstance(self.x, torch.Tensor) or self.x.dim() != 4 or self.x.dtype != torch.float32:
            raise DataError(
                "Split.x must be a float32 tensor of shape (N, C, H, W) (images) or an int64 tensor of shape "
                f"(N, T) (token sequences), got {_describe(self.x)}"
            )
        if not isinstance(self.y, torch.Tensor) or self.y.dim() != 1 or self.y.dtype != torch.int64:
            raise DataError(f"Split.y must be an int64 tensor of shape (N,), got {_describe(self.y)}")
        if self.x.shape[0] != self.y.shape[0]:
            raise DataError(
                f"Split.x has {self.x.shape[0]} samples but Split.y has {self.y.shape[0]} labels; expected equal counts"
            )

    @property
    def is_text(self) -> bool:
        """True when x holds int64 (N, T) token sequences rather than images."""
        return isinstance(self.x, torch.Tensor) and self.x.dim() == 2 and self.x.dtype == torch.int64

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True, eq=False)
class DataBundle:
    """Train/test splits plus the metadata a model and training loop need to be built for them.

    Images: `sequence_length` is 0 and x is (N, in_channels, image_size, image_size). Token sequences:
    `sequence_length` is T > 0, x and y are (N, T), `num_classes` is the vocabulary size, and the image
    fields `in_channels` and `image_size` are 0 and `augment` is False.
    """

    train: Split
    test: Split
    num_classes: int  # classes, or the vocabulary size for token sequences
    in_channels: int
    image_size: int
    augment: bool
    sequence_length: int = 0  # T for token sequences; 0 for images

    @property
    def is_text(self) -> bool:
        """True when the bundle holds token sequences for language modelling, False for images."""
        return self.sequence_length > 0

    def __post_init__(self) -> None:
        if self.num_classes < 2:
            raise DataError(f"DataBundle.num_classes must be >= 2, got {self.num_classes}")
        if self.sequence_length < 0:
            raise DataError(f"DataBundle.sequence_length must be >= 0 (0 for images), got {self.sequence_length}")
        if self.is_text:
            self._check_text()
            return
        expected = (self.in_channels, self.image_size, self.image_size)
        for name, split in (("train", self.train), ("test", self.test)):
            if split.is_text:
                raise DataError(
                    f"DataBundle.{name} holds token sequences of shape {tuple(split.x.shape)} but "
                    "sequence_length is 0; set sequence_length=T for text"
                )
            if tuple(split.x.shape[1:]) != expected:
                raise DataError(
                    f"DataBundle.{name}.x has sample shape {tuple(split.x.shape[1:])}, expected {expected}"
                )
            _check_range(f"DataBundle.{name}.y", "labels", split.y, self.num_classes)

    def _check_text(self) -> None:
        """Validate a token-sequence bundle: no image fields, (N, T) splits, tokens within the vocabulary."""
        if self.in_channels != 0 or self.image_size != 0 or self.augment:
            raise DataError(
                "DataBundle for token sequences must have in_channels=0, image_size=0 and augment=False, got "
                f"in_channels={self.in_channels}, image_size={self.image_size}, augment={self.augment}"
            )
        for name, split in (("train", self.train), ("test", self.test)):
            if not split.is_text or split.x.shape[1] != self.sequence_length:
                raise DataError(
                    f"DataBundle.{name}.x is {_describe(split.x)}, expected an int64 tensor of shape "
                    f"(N, {self.sequence_length}) (sequence_length={self.sequence_length})"
                )
            _check_range(f"DataBundle.{name}.x", "tokens", split.x, self.num_classes)
            _check_range(f"DataBundle.{name}.y", "tokens", split.y, self.num_classes)


def _check_range(where: str, what: str, values: torch.Tensor, count: int) -> None:
    """Raise DataError unless every value lies in [0, count)."""
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= count):
        raise DataError(
            f"{where} has {what} in [{int(values.min())}, {int(values.max())}], expected {what} in [0, {count - 1}]"
        )


def _describe(value: object) -> str:
    """Say what a value is in a few words, for error messages."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
