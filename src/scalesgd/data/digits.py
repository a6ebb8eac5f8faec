"""scikit-learn's bundled 8x8 digits as a DataBundle: a real but tiny task that needs no download."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from scalesgd.data.dataset import DataBundle, Split

TEST_FRACTION = 0.2
SPLIT_SEED = 0
TRAIN_SIZE = 1437  # of the 1797 images, after the stratified split


def load_digits_bundle() -> DataBundle:
    """Return a fixed stratified 1437/360 split, standardised with the train mean and std."""
    digits = load_digits()
    images = np.asarray(digits.images, dtype=np.float32) / 16.0
    labels = np.asarray(digits.target, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=labels
    )
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
