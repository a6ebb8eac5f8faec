"""Image folder trees in the ImageNet layout (root/train/<class>/<file>, root/val/<class>/<file>), written for tests,
benchmarks and checking the folder-reading path without the real 150 GB download.

`write_fake_tree` makes real JPEGs whose classes differ in colour and in the orientation and frequency of a stripe
pattern, so a network can learn them; `export_digits` writes scikit-learn's 8x8 digits (Alpaydin and Kaynak 1998,
"Optical Recognition of Handwritten Digits", UCI) as greyscale PNGs with the split the in-memory `digits` dataset uses.

Either writes its tree into a hidden folder inside `out` and moves train/ and val/ into place only when every file is
written: stopped part-way (Ctrl-C, a full disk), it removes what it wrote, so no later run trains on half a tree.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from numbers import Integral
from pathlib import Path

import numpy as np
from PIL import Image

from scalesgd.data.digits import split_digits
from scalesgd.data.imagefolder.scan import PARTIAL_PREFIX

SPLITS = ("train", "val")
STRIPE_AMPLITUDE = 50.0  # grey levels either side of the base colour
NOISE_SHIFT = 3  # noise is a random byte shifted right by this: NOISE_LEVELS uniform grey levels, centred on 0
NOISE_LEVELS = 256 >> NOISE_SHIFT
CYCLES = (2.0, 8.0)  # stripes per short side, from the first class to the last
DIGIT_LEVEL = 15  # digits pixels 0..16 are written as 0..240, so the value divides back exactly


def write_fake_tree(
    out: Path,
    classes: int = 10,
    per_class: int = 50,
    size: tuple[int, int] = (375, 500),
    val_per_class: int | None = None,
    seed: int = 0,
    quality: int = 90,
) -> dict[str, int]:
    """An ImageNet-like tree of real JPEGs: out/train/<class>/*.JPEG and out/val/<class>/*.JPEG.

    `size` is (width, height). Class folders are made-up synset names `n00000000`, `n00000001`, ...; files are
    `<class>_<index:05d>.JPEG`. A pixel is its class's base colour, plus its class's sinusoidal stripes (an
    orientation and frequency of its own) at a per-image phase, plus per-image noise: the same arguments write
    byte-identical files.
    """
    out = Path(out)
    if val_per_class is None:
        val_per_class = max(1, per_class // 5) if isinstance(per_class, Integral) else per_class
    _check_int("classes", classes, 1)
    _check_int("per_class", per_class, 1)
    _check_int("val_per_class", val_per_class, 1)
    _check_int("seed", seed, 0)
    _check_int("quality", quality, 1, 100)
    width, height = _check_size(size)
    _refuse_existing(out)
    written = 0
    with written_whole(out) as partial:
        for index in range(classes):
            name = class_name(index)
            stripes = _class_stripes(index, classes, width, height)
            colour = _class_colour(index, seed)
            for split, count in zip(SPLITS, (per_class, val_per_class)):
                folder = partial / split / name
                folder.mkdir(parents=True, exist_ok=True)
                for image_index in range(count):
                    rng = np.random.default_rng([seed, index, SPLITS.index(split), image_index])
                    path = folder / f"{name}_{image_index:05d}.JPEG"
                    written += _save(_fake_pixels(colour, stripes, rng), "RGB", path, "JPEG", quality=quality)
    return {"train": classes * per_class, "val": classes * val_per_class, "classes": classes, "bytes": written}


def export_digits(out: Path) -> dict[str, int]:
    """scikit-learn's 8×8 digits as an image folder tree of greyscale PNGs, with the same train/test split as the
    in-memory `digits` dataset.

    Pixels 0..16 are written as v * 15 (0..240, exact): divide by 15 to recover them. Standardising with the training
    mean and std, as `digits` does, makes any such factor vanish. Files are out/{train,val}/<digit>/<i:05d>.png, with i
    the sample's position in its split, so sorting by name keeps the split's order within a class.
    """
    out = Path(out)
    _refuse_existing(out)
    x_train, x_val, y_train, y_val = split_digits()
    x_train, x_val = (np.asarray(x).astype(np.uint8) for x in (x_train, x_val))  # integers 0..16 held as floats
    written = 0
    with written_whole(out) as partial:
        for split, x, y in (("train", x_train, y_train), ("val", x_val, y_val)):
            for label in range(10):
                (partial / split / str(label)).mkdir(parents=True, exist_ok=True)
            for position, (pixels, label) in enumerate(zip(x, y)):
                written += _save(pixels * DIGIT_LEVEL, "L", partial / split / str(int(label)) / f"{position:05d}.png",
                                 "PNG")
    return {"train": len(y_train), "val": len(y_val), "classes": 10, "bytes": written}


@contextmanager
def written_whole(out: Path) -> Iterator[Path]:
    """A hidden folder inside `out` to write train/ and val/ into, moved into `out` once the body ends: stopped
    part-way, what was written (and `out` and its parents, where this made them) is removed, so no later run takes
    half a tree for a dataset."""
    out = Path(out)
    made, partial = _first_missing(out), None
    try:
        out.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=PARTIAL_PREFIX, dir=out))
        yield partial
        for split in reversed(SPLITS):  # val/ first: a tree cut between the two moves has no train/, and is refused
            os.replace(partial / split, out / split)
        partial.rmdir()
    except BaseException:
        with _uninterrupted():
            if partial is not None:
                shutil.rmtree(partial, ignore_errors=True)
            _remove_made(out, made)
        raise


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C ignored while a half-written tree is removed: a second one would leave it half removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _first_missing(path: Path) -> Path | None:
    """The outermost of `path` and its parents that does not exist yet (None: `path` exists): what making it makes."""
    missing = None
    for part in (path, *path.parents):
        if part.exists():
            break
        missing = part
    return missing


def _remove_made(out: Path, made: Path | None) -> None:
    """Remove `out` and its parents up to `made` (the folders writing made), each only while it is empty."""
    if made is None:
        return
    for part in (out, *out.parents):
        try:
            part.rmdir()
        except OSError:
            return
        if part == made:
            return


def _save(pixels: np.ndarray, mode: str, path: Path, image_format: str, **params) -> int:
    """Write one image; its size in bytes."""
    Image.fromarray(pixels, mode).save(path, image_format, **params)
    return path.stat().st_size


def class_name(index: int) -> str:
    """A made-up synset-like folder name, so tools that expect ImageNet's `n%08d` names accept the tree."""
    return f"n{index:08d}"


def _class_colour(index: int, seed: int) -> np.ndarray:
    """A base RGB colour per class, away from 0 and 255 so the stripes and noise rarely clip."""
    return np.random.default_rng([seed, index, len(SPLITS)]).uniform(70.0, 185.0, size=3)


def _class_stripes(index: int, classes: int, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """The class's stripe wave as its sine and cosine planes, so a per-image phase costs a weighted sum."""
    angle = math.pi * index / classes  # classes spread over orientations...
    cycles = CYCLES[0] + (CYCLES[1] - CYCLES[0]) * ((index * 7) % classes) / classes  # ...and over frequencies
    frequency = 2 * math.pi * cycles / min(width, height)
    y, x = np.mgrid[:height, :width].astype(np.float32)
    wave = frequency * (x * math.cos(angle) + y * math.sin(angle))
    return np.sin(wave), np.cos(wave)


def _fake_pixels(colour: np.ndarray, stripes: tuple[np.ndarray, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """One image, (height, width, 3) uint8: base colour, stripes at a random phase and contrast, and noise."""
    phase = rng.uniform(0.0, 2 * math.pi)
    amplitude = STRIPE_AMPLITUDE * rng.uniform(0.7, 1.3)
    tint = rng.uniform(0.5, 1.0, size=3)  # how strongly each channel carries the stripes
    sine, cosine = stripes
    wave = (amplitude * math.cos(phase)) * sine + (amplitude * math.sin(phase)) * cosine  # sin(wave + phase)
    pixels = np.empty(wave.shape + (3,), dtype=np.float32)
    for channel in range(3):  # channel by channel into place: a broadcast product is several times slower
        np.multiply(wave, np.float32(tint[channel]), out=pixels[:, :, channel])
    pixels += (colour - NOISE_LEVELS / 2).astype(np.float32)
    pixels += np.frombuffer(rng.bytes(pixels.size), dtype=np.uint8).reshape(pixels.shape) >> NOISE_SHIFT
    return np.clip(pixels, 0, 255, out=pixels).astype(np.uint8)


def _refuse_existing(out: Path) -> None:
    """Never write over a user's data: a non-empty out/train or out/val stops the export before any file is made."""
    for split in SPLITS:
        folder = out / split
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise FileExistsError(f"{folder} already exists and is not empty; choose an empty or new folder")


def _check_int(name: str, value: int, low: int, high: int | None = None) -> None:
    """Refuse a count or setting that is not an int within [low, high]."""
    accepted = f"an int >= {low}" if high is None else f"an int from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {accepted}, got {value!r}")


def _check_size(size: tuple[int, int]) -> tuple[int, int]:
    """(width, height), each an int >= 1."""
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise ValueError(f"size must be (width, height), got {size!r}")
    _check_int("size width", size[0], 1)
    _check_int("size height", size[1], 1)
    return int(size[0]), int(size[1])
