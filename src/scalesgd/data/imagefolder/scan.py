"""Image folders in the ImageNet layout (DIR/train/<class>/*, DIR/val/<class>/*): found, checked and pre-scanned.

Class names sorted give the labels, as in the PyTorch ImageNet example; files are listed, never loaded: each is
decoded when a batch needs it (`scalesgd.data.imagefolder.files`). The pre-scan reads every file's header only, so
an empty file or one that is no image stops a run before training, naming it.
"""

from __future__ import annotations

import os
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from scalesgd.data.dataset import DataError, not_a_folder

SPLITS = ("train", "val")
FORMATS = ("JPEG", "PNG")  # what the pipeline decodes; anything else is a bad file
EXTENSIONS = (".JPEG", ".jpg", ".jpeg", ".png")  # such files' usual names (each is read by content, whatever its name)
PARTIAL_PREFIX = ".scalesgd-partial-"  # `scalesgd data` writes a tree in such a folder, then moves it into place
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
    large: list[tuple[str, int]] = field(default_factory=list)  # (path, pixels): over Pillow's limit, under twice it

    def warn_large(self) -> None:
        """Name each image over Pillow's pixel limit once, as every scalesgd warning is said: on stderr, by rank 0
        alone (every rank pre-scans the same folder)."""
        if os.environ.get("RANK", "0") != "0":
            return
        for path, pixels in self.large:
            print(f"scalesgd: warning: {large_image_warning(path, pixels)}", file=sys.stderr)


def check_image_folder(data_dir: str | Path) -> Path:
    """Raise DataError naming what is wrong unless `data_dir` has train/ and val/ class folders with files in each,
    and every val/ class is one of train/'s; the folder. Lists directories only: no file is opened."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise not_a_folder(root, "image folder", "a directory with train/ and val/ class folders")
    if root.name.startswith(PARTIAL_PREFIX):
        raise DataError(f"{root} is a tree `scalesgd data` was stopped while writing, not a whole one; remove it and "
                        "write the tree again")
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
                raise DataError(f"class folder {root / split / name} has no image files: it needs JPEG or PNG files "
                                f"({', '.join(EXTENSIONS)} alike: each is read by its content, whatever its name; "
                                "names starting with '.' are left out)")
    return root


def class_names(split_dir: Path) -> list[str]:
    """The class folders of a split, sorted (hidden ones left out)."""
    return sorted(e.name for e in _entries(split_dir) if not e.name.startswith(".") and _is_folder(e))


def files_of(class_dir: Path) -> list[str]:
    """A class folder's files, sorted by name (hidden ones such as .DS_Store left out); a link that cannot be followed
    is listed too, so the pre-scan names it (or leaves it out) as the bad file it is."""
    return sorted(str(class_dir / e.name) for e in _entries(class_dir) if not e.name.startswith(".") and _is_file(e))


def _entries(folder: Path) -> list[os.DirEntry]:
    """A folder's entries; DataError naming a folder that cannot be listed."""
    try:
        with os.scandir(folder) as found:
            return list(found)
    except OSError as err:
        raise DataError(f"folder {folder} cannot be listed ({err.strerror or err})") from None


def _is_folder(entry: os.DirEntry) -> bool:
    """Whether an entry of a split is a class folder; DataError naming a link that cannot be followed (one to itself),
    where a class was meant."""
    try:
        return entry.is_dir()
    except OSError as err:
        raise DataError(f"{entry.path} is a symbolic link that cannot be followed ({err.strerror or err}); remove it "
                        "or point it at a class folder") from None


def _is_file(entry: os.DirEntry) -> bool:
    """Whether an entry of a class folder is a file, counting a link that cannot be followed as one."""
    try:
        return entry.is_file() or (entry.is_symlink() and not os.path.exists(entry.path))
    except OSError:
        return True


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
    with ThreadPoolExecutor(SCAN_THREADS) as pool, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # said once per file below, naming it
        headers = {s: list(pool.map(read_header, [p for p, _ in splits[s]])) for s in SPLITS}
    bad, large, grey, kept = [], [], True, {}
    for s in SPLITS:
        kept[s] = []
        for (path, y), (mode, problem, pixels) in zip(splits[s], headers[s]):
            if problem:
                if not skip_bad:
                    raise DataError(f"{path}: {problem}; {SKIP_HINT}")
                bad.append((path, problem))
                continue
            if over_pixel_limit(pixels):
                large.append((path, pixels))
            grey = grey and mode in GREY_MODES
            kept[s].append((path, y))
        if not kept[s]:
            raise DataError(f"{root / s} has no readable images left after skipping {len(bad)} bad file(s)")
    return FolderIndex(classes, kept["train"], kept["val"], 1 if grey else 3, bad, large)


def read_header(path: str) -> tuple[str, str, int]:
    """(the image's mode, "", its pixels) from its header, or ("", what is wrong with the file, 0)."""
    try:
        if os.path.getsize(path) == 0:
            return "", "empty file", 0
        with Image.open(path) as image:
            if image.format not in FORMATS:
                return "", f"a {image.format} image, not a JPEG or PNG", 0
            return image.mode, "", image.width * image.height
    except UnidentifiedImageError:
        return "", "not an image (no JPEG or PNG header)", 0
    except Image.DecompressionBombError:
        return "", (f"more than {2 * Image.MAX_IMAGE_PIXELS:,} pixels (twice Pillow's limit of "
                    f"{Image.MAX_IMAGE_PIXELS:,}), which Pillow refuses to decode as a possible decompression bomb"), 0
    except OSError as err:
        return "", f"cannot be read ({err.strerror or err})", 0
    except (SyntaxError, ValueError) as err:
        return "", f"unreadable ({err})", 0


def over_pixel_limit(pixels: int) -> bool:
    """Whether an image has more pixels than Pillow decodes without warning of a decompression bomb."""
    return Image.MAX_IMAGE_PIXELS is not None and pixels > Image.MAX_IMAGE_PIXELS


def large_image_warning(path: str, pixels: int) -> str:
    """What to say of an image over Pillow's pixel limit (and under twice it, which is refused): it is read anyway."""
    return (f"{path} has {pixels:,} pixels, over Pillow's limit of {Image.MAX_IMAGE_PIXELS:,} for a safe decode (a "
            "possible decompression bomb); it is read anyway, slowly and with much memory")
