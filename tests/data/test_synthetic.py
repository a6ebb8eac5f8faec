"""Synthetic task: deterministic, right shapes, balanced, learnable yet not trivial."""

from __future__ import annotations

import pytest
import torch

import scalesgd.data.synthetic as synthetic
from scalesgd.data import DataBundle, Split, load_bundle, load_synthetic_bundle


def nearest_class_mean_accuracy(bundle) -> float:
    """Test accuracy of the simplest possible classifier: distance to each class's mean training image."""
    means = torch.stack([bundle.train.x[bundle.train.y == k].mean(0) for k in range(bundle.num_classes)])
    distances = torch.cdist(bundle.test.x.flatten(1), means.flatten(1))
    return float((distances.argmin(1) == bundle.test.y).float().mean())


def test_shapes_dtypes_metadata_and_default_test_size():
    bundle = load_synthetic_bundle(samples=100, image_size=12, num_classes=4, channels=2)
    assert bundle.train.x.shape == (100, 2, 12, 12) and bundle.test.x.shape == (20, 2, 12, 12)
    assert bundle.train.x.dtype == torch.float32 and bundle.train.y.dtype == torch.int64
    assert (bundle.num_classes, bundle.in_channels, bundle.image_size, bundle.augment) == (4, 2, 12, False)
    assert torch.isfinite(bundle.train.x).all() and torch.isfinite(bundle.test.x).all()
    assert len(load_synthetic_bundle(samples=10, image_size=8).test) == 10  # at least one per class
    assert len(load_synthetic_bundle(samples=30, image_size=8, test_samples=7).test) == 7


def test_deterministic_given_arguments_and_seed_sensitive():
    a = load_synthetic_bundle(samples=64, image_size=8, seed=5)
    b = load_synthetic_bundle(samples=64, image_size=8, seed=5)
    c = load_synthetic_bundle(samples=64, image_size=8, seed=6)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert torch.equal(a.test.x, b.test.x) and torch.equal(a.test.y, b.test.y)
    assert not torch.equal(a.train.x, c.train.x)


def test_train_and_test_are_independent_streams():
    small = load_synthetic_bundle(samples=40, image_size=8, test_samples=40)
    bigger_test = load_synthetic_bundle(samples=40, image_size=8, test_samples=80)
    # Asking for more test samples leaves the train set untouched...
    assert torch.equal(small.train.y, bigger_test.train.y)
    assert torch.allclose(small.train.x, bigger_test.train.x)
    # ...and test samples are not copies of train samples.
    assert torch.cdist(small.test.x.flatten(1), small.train.x.flatten(1)).min() > 1.0


def test_classes_are_balanced_and_train_is_standardised():
    bundle = load_synthetic_bundle(samples=1003, image_size=8, num_classes=10)
    counts = torch.bincount(bundle.train.y, minlength=10)
    assert int(counts.max() - counts.min()) <= 1
    assert torch.unique(bundle.test.y).numel() == 10
    assert abs(float(bundle.train.x.mean())) < 1e-4
    assert abs(float(bundle.train.x.std()) - 1.0) < 1e-3
    assert 0.8 < float(bundle.test.x.std()) < 1.2  # same distribution, so roughly the same scale


def test_learnable_far_above_chance_but_not_trivial():
    bundle = load_synthetic_bundle(samples=2000, image_size=16, num_classes=10)
    accuracy = nearest_class_mean_accuracy(bundle)
    assert 0.45 < accuracy < 0.95, accuracy  # chance is 0.10


def test_labels_carry_the_signal():
    bundle = load_synthetic_bundle(samples=2000, image_size=16, num_classes=10)
    permutation = torch.randperm(2000, generator=torch.Generator().manual_seed(0))
    shuffled = DataBundle(
        train=Split(x=bundle.train.x, y=bundle.train.y[permutation]),
        test=bundle.test,
        num_classes=10,
        in_channels=bundle.in_channels,
        image_size=16,
        augment=False,
    )
    assert nearest_class_mean_accuracy(shuffled) < 0.25


def test_generation_across_chunk_boundaries(monkeypatch):
    monkeypatch.setattr(synthetic, "CHUNK", 16)
    bundle = load_synthetic_bundle(samples=50, image_size=6, num_classes=5)
    assert bundle.train.x.shape == (50, 3, 6, 6)
    assert int(torch.bincount(bundle.train.y).min()) == 10
    # Every chunk got fresh noise: no two samples are identical.
    assert torch.pdist(bundle.train.x.flatten(1)).min() > 0


@pytest.mark.parametrize(("image_size", "channels"), [(1, 3), (2, 1), (3, 1), (5, 2)])
def test_tiny_images_work(image_size, channels):
    bundle = load_synthetic_bundle(samples=20, image_size=image_size, num_classes=2, channels=channels)
    assert bundle.train.x.shape == (20, channels, image_size, image_size)
    assert torch.isfinite(bundle.train.x).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"samples": 0, "image_size": 8},
        {"samples": 10, "image_size": 0},
        {"samples": 10, "image_size": 8, "num_classes": 1},
        {"samples": 10, "image_size": 8, "channels": 0},
        {"samples": 10, "image_size": 8, "test_samples": 0},
        {"samples": 10, "image_size": 1, "channels": 1},
    ],
)
def test_invalid_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError, match="load_synthetic_bundle"):
        load_synthetic_bundle(**kwargs)


def test_the_memory_estimate_covers_what_a_bundle_holds():
    bundle = load_synthetic_bundle(samples=300, image_size=8, num_classes=4, channels=2)
    held = sum(t.numel() * t.element_size() for split in (bundle.train, bundle.test) for t in (split.x, split.y))
    estimate = synthetic.synthetic_bytes(300, 8, 4, channels=2)
    assert held < estimate
    splits = (10**6 + 2 * 10**5) * (3 * 32 * 32 * 4 + 8)  # train and test images and labels, at scale
    assert splits < synthetic.synthetic_bytes(10**6, 32) < 1.01 * splits
    assert synthetic.synthetic_bytes(10**12, 32) > 10**16  # known before anything is generated


def test_load_bundle_dispatches_to_synthetic():
    bundle = load_bundle("synthetic", samples=60, image_size=8, num_classes=3)
    assert bundle.train.x.shape == (60, 3, 8, 8) and bundle.num_classes == 3
