"""scikit-learn's bundled 8x8 digits as a DataBundle: a real but tiny task that needs no download."""

from __future__ import annotations

import numpy as np
import torch

from scalesgd.data.dataset import DataBundle, Split

TEST_FRACTION = 0.2
SPLIT_SEED = 0
TRAIN_SIZE = 1437  # of the 1797 images, after the stratified split


def split_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed stratified split (pixels 0..16 as floats): train images, test images, train labels, test labels."""
    from sklearn.datasets import load_digits  # scikit-learn takes 0.8 s to import: only a run on digits pays it
    from sklearn.model_selection import train_test_split  # (the same)

    digits = load_digits()
    labels = np.asarray(digits.target, dtype=np.int64)
    return train_test_split(digits.images, labels, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=labels)


def load_digits_bundle() -> DataBundle:
    """Return a fixed stratified 1437/360 split, standardised with the train mean and std."""
    x_train, x_test, y_train, y_test = split_digits()
    x_train = np.asarray(x_train, dtype=np.float32) / 16.0
    x_test = np.asarray(x_test, dtype=np.float32) / 16.0
    mean = float(x_train.mean())
    std = float(x_train.std())

    def to_split(x: np.ndarray, y: np.ndarray) -> Split:
        tensor = torch.from_numpy((x - mean) / std).to(torch.float32).unsqueeze(1).contiguous()
        return Split(x=tensor, y=torch.from_numpy(y).to(torch.int64))

    return DataBundle(
        train=to_split(x_train, y_train),
        test=to_split(x_test, y_test),
        num_classes=10,
        in_channels=1,
        image_size=8,
        augment=False,
    )
