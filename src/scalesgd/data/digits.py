"""scikit-learn's bundled 8x8 digits as a DataBundle: a real but tiny task that needs no download."""

from __future__ import annotations

import io
import os
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from scalesgd.data.dataset import DataBundle, Split
from scalesgd.output import write_whole

TEST_FRACTION = 0.2
SPLIT_SEED = 0
TRAIN_SIZE = 1437  # of the 1797 images, after the stratified split
SPLIT_NAMES = ("x_train", "x_test", "y_train", "y_test")


def split_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed stratified split (pixels 0..16 as floats): train images, test images, train labels, test labels.

    Computed by scikit-learn once and kept in the user's cache: importing it took 1.5 s of every digits run's start,
    in every worker. A cache that cannot be read or written is computed again."""
    cached = cache_path()
    if cached is None:
        return _split_with_sklearn()
    try:
        with np.load(cached) as kept:
            return tuple(kept[name] for name in SPLIT_NAMES)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # absent, or damaged
        pass
    split = _split_with_sklearn()
    kept = io.BytesIO()
    np.savez(kept, **dict(zip(SPLIT_NAMES, split)))
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_whole(cached, kept.getvalue())
    except OSError:
        pass
    return split


def cache_path() -> Path | None:
    """Where the split is kept: the user's cache, under scikit-learn's version (its split is what defines it); None
    where this user has no home to keep it in."""
    home = os.path.expanduser("~")
    root = os.environ.get("XDG_CACHE_HOME") or (None if home == "~" else os.path.join(home, ".cache"))
    if root is None:
        return None
    return Path(root) / "scalesgd" / f"digits-split-sklearn-{metadata.version('scikit-learn')}.npz"


def _split_with_sklearn() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # heavy (1.5 s): loaded only when the cached split is missing
    from sklearn.model_selection import train_test_split  # (the same)

    digits = load_digits()
    labels = np.asarray(digits.target, dtype=np.int64)
    return tuple(train_test_split(digits.images, labels, test_size=TEST_FRACTION, random_state=SPLIT_SEED,
                                  stratify=labels))


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
