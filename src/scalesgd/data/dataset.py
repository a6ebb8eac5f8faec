"""In-memory dataset containers shared by every loader, so training code sees one shape of data."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class DataError(ValueError):
    """Bad or missing data on disk or in memory, reported as one line naming the culprit."""


@dataclass(frozen=True, eq=False)
class Split:
    """One labelled split kept as whole tensors because the datasets are small enough for memory."""

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.x, torch.Tensor) or self.x.dim() != 4 or self.x.dtype != torch.float32:
            raise DataError(f"Split.x must be a float32 tensor of shape (N, C, H, W), got {_describe(self.x)}")
        if not isinstance(self.y, torch.Tensor) or self.y.dim() != 1 or self.y.dtype != torch.int64:
            raise DataError(f"Split.y must be an int64 tensor of shape (N,), got {_describe(self.y)}")
        if self.x.shape[0] != self.y.shape[0]:
            raise DataError(
                f"Split.x has {self.x.shape[0]} samples but Split.y has {self.y.shape[0]} labels; expected equal counts"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True, eq=False)
class DataBundle:
    """Train/test splits plus the metadata a model and training loop need to be built for them."""

    train: Split
    test: Split
    num_classes: int
    in_channels: int
    image_size: int
    augment: bool

    def __post_init__(self) -> None:
        if self.num_classes < 2:
            raise DataError(f"DataBundle.num_classes must be >= 2, got {self.num_classes}")
        expected = (self.in_channels, self.image_size, self.image_size)
        for name, split in (("train", self.train), ("test", self.test)):
            if tuple(split.x.shape[1:]) != expected:
                raise DataError(
                    f"DataBundle.{name}.x has sample shape {tuple(split.x.shape[1:])}, expected {expected}"
                )
            if len(split) and (int(split.y.min()) < 0 or int(split.y.max()) >= self.num_classes):
                raise DataError(
                    f"DataBundle.{name}.y has labels in [{int(split.y.min())}, {int(split.y.max())}], "
                    f"expected labels in [0, {self.num_classes - 1}]"
                )


def _describe(value: object) -> str:
    """Say what a value is in a few words, for error messages."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__
