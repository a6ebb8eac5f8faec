"""Split and DataBundle: validated, immutable containers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from scalesgd.data import DataBundle, DataError, Split


def split(n: int = 4, c: int = 1, size: int = 3, classes: int = 2) -> Split:
    return Split(x=torch.zeros(n, c, size, size), y=torch.arange(n) % classes)


def test_split_len_and_frozen():
    s = split(5)
    assert len(s) == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.x = torch.zeros(1, 1, 1, 1)


@pytest.mark.parametrize(
    ("x", "y", "fragment"),
    [
        (torch.zeros(4, 3, 3), torch.zeros(4, dtype=torch.int64), "Split.x"),
        (torch.zeros(4, 1, 3, 3, dtype=torch.float64), torch.zeros(4, dtype=torch.int64), "float32"),
        (torch.zeros(4, 1, 3, 3), torch.zeros(4, dtype=torch.int32), "Split.y"),
        (torch.zeros(4, 1, 3, 3), torch.zeros(4, 1, dtype=torch.int64), "Split.y"),
        (torch.zeros(4, 1, 3, 3), torch.zeros(5, dtype=torch.int64), "4 samples but Split.y has 5"),
    ],
)
def test_split_rejects_malformed_tensors(x, y, fragment):
    with pytest.raises(DataError, match=fragment) as error:
        Split(x=x, y=y)
    assert "\n" not in str(error.value)


def test_bundle_checks_shapes_and_labels():
    DataBundle(train=split(), test=split(2), num_classes=2, in_channels=1, image_size=3, augment=False)
    with pytest.raises(DataError, match=r"expected \(2, 3, 3\)"):
        DataBundle(train=split(), test=split(), num_classes=2, in_channels=2, image_size=3, augment=False)
    with pytest.raises(DataError, match="test.y has labels"):
        DataBundle(train=split(), test=split(classes=3), num_classes=2, in_channels=1, image_size=3, augment=False)
    with pytest.raises(DataError, match="num_classes"):
        DataBundle(train=split(), test=split(), num_classes=1, in_channels=1, image_size=3, augment=False)


def test_bundle_allows_empty_split_and_compares_by_identity():
    empty = Split(x=torch.zeros(0, 1, 3, 3), y=torch.zeros(0, dtype=torch.int64))
    bundle = DataBundle(train=split(), test=empty, num_classes=2, in_channels=1, image_size=3, augment=False)
    assert len(bundle.test) == 0
    assert bundle == bundle and split() != split()  # no element-wise tensor comparison
