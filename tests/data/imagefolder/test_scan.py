"""Image folders in the ImageNet layout: what is wrong with one is one line naming it, before any file is decoded."""

from pathlib import Path

import pytest

from scalesgd.data import DataError, check_image_folder
from scalesgd.data.imagefolder.scan import count_train_images, index_image_folder
from scalesgd.data.imagefolder.trees import write_fake_tree


def tree(root: Path, classes: int = 2, per_class: int = 3) -> Path:
    write_fake_tree(root, classes, per_class, (20, 16), val_per_class=1)
    return root


def test_labels_are_the_sorted_class_names_and_every_file_is_listed_in_order(tmp_path):
    root = tree(tmp_path / "t")
    (root / "train" / "n00000001" / ".DS_Store").write_bytes(b"junk")  # hidden: not a sample
    index = index_image_folder(root)
    assert index.classes == ("n00000000", "n00000001") and index.channels == 3 and not index.bad
    assert [(Path(p).name, y) for p, y in index.train] == [
        (f"n0000000{c}_{i:05d}.JPEG", c) for c in range(2) for i in range(3)]
    assert len(index.val) == 2 and count_train_images(root) == 6


@pytest.mark.parametrize("damage, expected", [
    (lambda r: (r / "val").rename(r / "elsewhere"), "has no val/ folder"),
    (lambda r: [p.unlink() for p in (r / "train" / "n00000001").iterdir()], "n00000001 has no image files"),
    (lambda r: (r / "val" / "n00000009").mkdir(), "n00000009 is a class that"),
    (lambda r: [(r / "val" / d.name).rename(r / d.name) for d in list((r / "val").iterdir())], "has no class folders"),
])
def test_a_badly_laid_out_folder_is_one_line_naming_what_is_wrong(tmp_path, damage, expected):
    root = tree(tmp_path / "t")
    damage(root)
    with pytest.raises(DataError, match=expected) as err:
        check_image_folder(root)
    assert "\n" not in str(err.value)


def test_the_pre_scan_names_an_empty_or_non_image_file_or_leaves_it_out_when_asked(tmp_path):
    root = tree(tmp_path / "t")
    empty, text = root / "train" / "n00000000" / "empty.JPEG", root / "val" / "n00000001" / "notes.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=f"{empty}: empty file; `skip_bad_images`"):
        index_image_folder(root)
    empty.unlink()
    text.write_text("not a picture")
    with pytest.raises(DataError, match=f"{text}: not an image"):
        index_image_folder(root)
    empty.write_bytes(b"")
    index = index_image_folder(root, skip_bad=True)
    assert sorted(p for p, _ in index.bad) == sorted([str(empty), str(text)])
    assert len(index.train) == 6 and len(index.val) == 2  # the good ones all kept


def test_a_folder_of_greyscale_images_is_one_channel(tmp_path):
    from scalesgd.data.imagefolder.trees import export_digits
    export_digits(tmp_path / "d")
    index = index_image_folder(tmp_path / "d")
    assert index.channels == 1 and index.classes == tuple("0123456789") and len(index.train) == 1437
