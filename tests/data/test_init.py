"""Package surface: dataset names, dispatch and re-exports."""

from __future__ import annotations

import pytest

import scalesgd.data as data


def test_public_names():
    assert tuple(data.DATASETS) == ("digits", "synthetic", "cifar10", "imagefolder", "text")
    for name in ("DataError", "Split", "DataBundle", "GlobalBatchSampler", "random_crop_flip", "load_bundle"):
        assert name in data.__all__ and hasattr(data, name)


def test_unknown_dataset_lists_choices():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; choose from digits, synthetic, cifar10"):
        data.load_bundle("mnist")
