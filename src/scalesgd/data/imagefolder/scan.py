"""Image folders in the ImageNet layout (DIR/train/<class>/*, DIR/val/<class>/*): found, checked and pre-scanned.

Class names sorted give the labels, as in the PyTorch ImageNet example; files are listed, never loaded: each is
decoded when a batch needs it (`scalesgd.data.imagefolder.files`). The pre-scan reads every file's header only, so
an empty file or one that is no image stops a run before training, naming it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from scalesgd.data.dataset import DataError

SPLITS = ("train", "val")
FORMATS = ("JPEG", "PNG")  # what the pipeline decodes; anything else is a bad file
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # decoded as one channel; any other mode as RGB
SCAN_THREADS = 8  # headers are read on threads: a network file system answers many requests at once
SKIP_HINT = "`skip_bad_images` leaves such files out"


class BadImage(DataError):
    """A file in an image folder that cannot be decoded, named by its path (raised on the rank that met it)."""


@dataclass(frozen=True)
class FolderIndex:
    """What an image folder holds: the class names (label order), each split's (path, label) and the files left out."""

    classes: tuple[str, ...]
    train: list[tuple[str, int]]
    val: list[tuple[str, int]]
    channels: int  # 1 when every image is greyscale, else 3
    bad: list[tuple[str, str]] = field(default_factory=list)  # (path, what is wrong), when skipped


def check_image_folder(data_dir: str | Path) -> Path:
    """Raise DataError naming what is wrong unless `data_dir` has train/ and val/ class folders with files in each,
    and every val/ class is one of train/'s; the folder. Lists directories only: no file is opened."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"image folder not found: {root} (expected a directory with train/ and val/ class folders)")
    missing = [s for s in SPLITS if not (root / s).is_dir()]
    if missing:
        raise DataError(f"{root} has no {' or '.join(f'{s}/' for s in missing)} folder (expected DIR/train/<class>/* "
                        "and DIR/val/<class>/*, as ImageNet is laid out)")
    train, val = (class_names(root / s) for s in SPLITS)
    for split, names in (("train", train), ("val", val)):
        if not names:
            raise DataError(f"{root / split} has no class folders (expected {root / split}/<class>/<image files>)")
    extra = sorted(set(val) - set(train))
    if extra:
        raise DataError(f"{root / 'val' / extra[0]} is a class that {root / 'train'} does not have "
                        f"({len(extra)} such class(es)); val/ may only hold train/'s classes")
    for split, names in (("train", train), ("val", val)):
        for name in names:
            if not files_of(root / split / name):
                raise DataError(f"class folder {root / split / name} has no image files")
    return root


def class_names(split_dir: Path) -> list[str]:
    """The class folders of a split, sorted (hidden ones left out)."""
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def files_of(class_dir: Path) -> list[str]:
    """A class folder's files, sorted by name (hidden ones such as .DS_Store left out)."""
    return sorted(str(class_dir / e.name) for e in os.scandir(class_dir) if e.is_file() and not e.name.startswith("."))


def count_train_images(data_dir: str | Path) -> int:
    """Files under train/'s class folders: the training-set size, known from listings alone."""
    root = check_image_folder(data_dir)
    return sum(len(files_of(root / "train" / name)) for name in class_names(root / "train"))


def index_image_folder(data_dir: str | Path, skip_bad: bool = False) -> FolderIndex:
    """List and pre-scan the folder: every file's header is read. A file that is empty or not a JPEG or PNG raises
    DataError naming it (the same on every rank), or is left out (and listed in `bad`) with `skip_bad`."""
    root = check_image_folder(data_dir)
    classes = tuple(class_names(root / "train"))
    label = {name: i for i, name in enumerate(classes)}
    splits = {s: [(path, label[name]) for name in class_names(root / s) for path in files_of(root / s / name)]
              for s in SPLITS}
    with ThreadPoolExecutor(SCAN_THREADS) as pool:
        headers = {s: list(pool.map(read_header, [p for p, _ in splits[s]])) for s in SPLITS}
    bad, grey, kept = [], True, {}
    for s in SPLITS:
        kept[s] = []
        for (path, y), (mode, problem) in zip(splits[s], headers[s]):
            if problem:
                if not skip_bad:
                    raise DataError(f"{path}: {problem}; {SKIP_HINT}")
                bad.append((path, problem))
                continue
            grey = grey and mode in GREY_MODES
            kept[s].append((path, y))
        if not kept[s]:
            raise DataError(f"{root / s} has no readable images left after skipping {len(bad)} bad file(s)")
    return FolderIndex(classes, kept["train"], kept["val"], 1 if grey else 3, bad)


def read_header(path: str) -> tuple[str, str]:
    """(the image's mode, "") from its header, or ("", what is wrong with the file)."""
    try:
        if os.path.getsize(path) == 0:
            return "", "empty file"
        with Image.open(path) as image:
            if image.format not in FORMATS:
                return "", f"a {image.format} image, not a JPEG or PNG"
            return image.mode, ""
    except UnidentifiedImageError:
        return "", "not an image (no JPEG or PNG header)"
    except (OSError, SyntaxError, ValueError) as err:
        return "", f"unreadable ({err})"
