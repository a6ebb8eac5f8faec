"""ImageNet-layout trees: fake JPEG classes that differ and repeat byte for byte; digits exported with their split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from scalesgd.data.digits import load_digits_bundle
from scalesgd.data.imagefolder.trees import export_digits, write_fake_tree

SMALL = {"classes": 3, "per_class": 4, "size": (40, 30)}


def files(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_fake_tree_layout_counts_and_names(tmp_path):
    summary = write_fake_tree(tmp_path, classes=3, per_class=6, size=(40, 30), val_per_class=2)
    written = files(tmp_path)
    assert summary == {"train": 18, "val": 6, "classes": 3, "bytes": sum(map(len, written.values()))}
    for split, count in (("train", 6), ("val", 2)):
        assert sorted(path.name for path in (tmp_path / split).iterdir()) == ["n00000000", "n00000001", "n00000002"]
        names = sorted(path.name for path in (tmp_path / split / "n00000001").iterdir())
        assert names == [f"n00000001_{i:05d}.JPEG" for i in range(count)]
    with Image.open(tmp_path / "val" / "n00000002" / "n00000002_00001.JPEG") as image:
        assert image.format == "JPEG" and image.mode == "RGB" and image.size == (40, 30)


def test_fake_tree_defaults_to_a_fifth_for_val_and_width_by_height(tmp_path):
    summary = write_fake_tree(tmp_path, classes=1, per_class=10)
    assert (summary["train"], summary["val"]) == (10, 2)
    with Image.open(tmp_path / "train" / "n00000000" / "n00000000_00000.JPEG") as image:
        assert image.size == (375, 500)
    assert write_fake_tree(tmp_path / "few", classes=2, per_class=3)["val"] == 2  # at least one per class


def test_fake_tree_is_byte_identical_for_the_same_arguments(tmp_path):
    write_fake_tree(tmp_path / "a", **SMALL)
    write_fake_tree(tmp_path / "b", **SMALL)
    write_fake_tree(tmp_path / "c", seed=1, **SMALL)
    first, second, other = (files(tmp_path / name) for name in "abc")
    assert first == second
    assert first.keys() == other.keys() and all(first[name] != other[name] for name in first)


def test_fake_images_differ_within_a_class_and_classes_differ_in_mean_colour(tmp_path):
    write_fake_tree(tmp_path, classes=4, per_class=5, size=(40, 30))
    means = []
    for index in range(4):
        folder = tmp_path / "train" / f"n{index:08d}"
        pixels = np.stack([np.asarray(Image.open(path), dtype=np.float64) for path in sorted(folder.iterdir())])
        assert not np.array_equal(pixels[0], pixels[1])
        means.append(pixels.mean(axis=(0, 1, 2)))  # the class's mean RGB
        spread = pixels.mean(axis=(1, 2)).std(axis=0).max()  # how far one image's mean colour strays
        assert spread < 10
    distances = [np.abs(means[i] - means[j]).max() for i in range(4) for j in range(i)]
    assert min(distances) > 10


def test_fake_tree_refuses_a_non_empty_tree(tmp_path):
    (tmp_path / "val" / "mine").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="val"):
        write_fake_tree(tmp_path, **SMALL)
    assert not (tmp_path / "train").exists()  # nothing written before refusing


def test_fake_tree_writes_into_empty_split_folders(tmp_path):
    (tmp_path / "train").mkdir()
    assert write_fake_tree(tmp_path, **SMALL)["train"] == 12


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"classes": 0}, "classes"),
        ({"per_class": -1}, "per_class"),
        ({"per_class": 2.5}, "per_class"),
        ({"val_per_class": 0}, "val_per_class"),
        ({"size": (40,)}, "size"),
        ({"size": (0, 30)}, "width"),
        ({"size": (40, True)}, "height"),
        ({"quality": 101}, "quality"),
        ({"seed": -1}, "seed"),
    ],
)
def test_fake_tree_rejects_bad_arguments(tmp_path, arguments, fragment):
    with pytest.raises(ValueError, match=fragment):
        write_fake_tree(tmp_path, **{**SMALL, **arguments})
    assert not any(tmp_path.iterdir())


def read_split(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (as the 0..16 integers) and labels, in the split's order given by the file names."""
    paths = sorted(root.glob("*/*.png"), key=lambda path: path.name)
    images = np.stack([np.asarray(Image.open(path), dtype=np.int64) for path in paths])
    labels = np.array([int(path.parent.name) for path in paths])
    assert np.all(images % 15 == 0)
    return images // 15, labels


def test_export_digits_reproduces_the_digits_split(tmp_path):
    summary = export_digits(tmp_path)
    assert summary["train"] == 1437 and summary["val"] == 360 and summary["classes"] == 10
    assert summary["bytes"] == sum(path.stat().st_size for path in tmp_path.rglob("*.png"))
    assert sorted(path.name for path in (tmp_path / "val").iterdir()) == [str(digit) for digit in range(10)]
    with Image.open(tmp_path / "train" / "0" / sorted(p.name for p in (tmp_path / "train" / "0").iterdir())[0]) as im:
        assert im.format == "PNG" and im.mode == "L" and im.size == (8, 8)

    x_train, y_train = read_split(tmp_path / "train")
    x_val, y_val = read_split(tmp_path / "val")
    assert x_train.shape == (1437, 8, 8) and x_val.shape == (360, 8, 8) and x_train.max() == 16
    bundle = load_digits_bundle()
    train, val = x_train.astype(np.float32) / 16.0, x_val.astype(np.float32) / 16.0
    mean, std = float(train.mean()), float(train.std())
    assert np.array_equal(y_train, bundle.train.y.numpy()) and np.array_equal(y_val, bundle.test.y.numpy())
    np.testing.assert_allclose((train - mean) / std, bundle.train.x[:, 0].numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose((val - mean) / std, bundle.test.x[:, 0].numpy(), atol=1e-6, rtol=0)


def test_export_digits_refuses_a_non_empty_tree(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="train"):
        export_digits(tmp_path)
    assert [path.name for path in (tmp_path / "train").iterdir()] == ["keep.txt"]
