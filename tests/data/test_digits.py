"""Digits bundle: fixed stratified split, shapes, and standardisation with train statistics."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from scalesgd.data import DataBundle, load_bundle, load_digits_bundle
from scalesgd.data.digits import _split_with_sklearn, cache_path, split_digits


@pytest.fixture(scope="module")
def bundle() -> DataBundle:
    return load_digits_bundle()


def test_split_sizes_shapes_and_metadata(bundle):
    assert len(bundle.train) == 1437 and len(bundle.test) == 360
    assert bundle.train.x.shape == (1437, 1, 8, 8) and bundle.test.x.shape == (360, 1, 8, 8)
    assert bundle.train.x.dtype == torch.float32 and bundle.train.y.dtype == torch.int64
    assert (bundle.num_classes, bundle.in_channels, bundle.image_size, bundle.augment) == (10, 1, 8, False)


def test_split_is_stratified_and_uses_every_sample_once(bundle):
    raw = load_digits()
    all_labels = torch.cat([bundle.train.y, bundle.test.y])
    assert torch.equal(torch.bincount(all_labels), torch.bincount(torch.from_numpy(raw.target)))
    test_counts = torch.bincount(bundle.test.y, minlength=10)
    assert int(test_counts.min()) >= 35 and int(test_counts.max()) <= 37


def test_train_is_standardised_and_test_uses_train_statistics(bundle):
    assert abs(float(bundle.train.x.mean())) < 1e-5
    assert abs(float(bundle.train.x.std(unbiased=False)) - 1.0) < 1e-5
    # Reproduce the documented split and check both splits are (pixels/16 - train mean) / train std.
    raw = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        raw.images / 16.0, raw.target, test_size=0.2, random_state=0, stratify=raw.target
    )
    mean, std = x_train.mean(), x_train.std()
    assert torch.equal(bundle.train.y, torch.from_numpy(y_train))
    assert torch.equal(bundle.test.y, torch.from_numpy(y_test))
    expected_test = torch.from_numpy((x_test - mean) / std).float().unsqueeze(1)
    assert torch.allclose(bundle.test.x, expected_test, atol=1e-5)
    assert abs(float(bundle.test.x.mean())) > 1e-4  # test is not re-standardised on its own statistics


def test_deterministic_across_calls(bundle):
    again = load_digits_bundle()
    assert torch.equal(again.train.x, bundle.train.x) and torch.equal(again.test.y, bundle.test.y)


def test_load_bundle_dispatches_to_digits():
    assert len(load_bundle("digits").train) == 1437


def test_the_split_is_kept_in_the_users_cache_and_read_back_without_scikit_learn(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    direct = _split_with_sklearn()
    first = split_digits()
    assert cache_path().parent == tmp_path / "scalesgd" and [p.name for p in cache_path().parent.iterdir()] == [
        cache_path().name]
    read = subprocess.run([sys.executable, "-c", "import sys; from scalesgd.data.digits import split_digits; "
                           "split_digits(); print('sklearn' in sys.modules)"], capture_output=True, text=True,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)}, check=True)
    assert read.stdout.strip() == "False"  # read back from the cache: scikit-learn never imported
    for a, b, c in zip(direct, first, split_digits()):
        assert np.array_equal(a, b) and np.array_equal(a, c) and a.dtype == c.dtype


def test_a_damaged_cache_is_computed_again_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache_path().parent.mkdir(parents=True)
    cache_path().write_bytes(b"PK\x03\x04 cut short")
    split = split_digits()
    assert all(np.array_equal(a, b) for a, b in zip(split, _split_with_sklearn()))
    with np.load(cache_path()) as kept:
        assert np.array_equal(kept["y_test"], split[3])
