"""`scalesgd data fake` and `scalesgd data export`: image folder trees in the ImageNet layout, for trying the
folder pipeline without ImageNet and for checking it against the in-memory datasets."""

from __future__ import annotations

import errno
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scalesgd import checks, output
from scalesgd.data.imagefolder.trees import export_digits, write_fake_tree
from scalesgd.errors import UsageError
from scalesgd.options import Options, option

SIZE = re.compile(r"^(\d+)x(\d+)$")
EXPORTABLE = ("digits",)
EXIT_INTERRUPTED = 130  # what a shell reports for a command ended by Ctrl-C (128 + SIGINT)



def _size(text: str) -> str | None:
    """What is wrong with a WIDTHxHEIGHT value, or None."""
    match = SIZE.match(text)
    if not match or not all(0 < int(v) <= 8192 for v in match.groups()):
        return "give WIDTHxHEIGHT in pixels, each 1..8192 (e.g. 375x500)"
    return None


def _empty_or_new(value: str) -> str | None:
    """A tree is written only where no train/ or val/ holds files already (a user's data is never overwritten), and
    only where a folder can be made."""
    for split in ("train", "val"):
        folder = Path(value) / split
        if folder.is_dir() and any(folder.iterdir()):
            return f"{folder} already holds files; give a new or empty folder"
    return checks.output_dir(value)


def _exportable(value: str) -> str | None:
    """A dataset `scalesgd data export` can write."""
    return None if value in EXPORTABLE else f"is not one that can be exported; choose from {', '.join(EXPORTABLE)}"


@dataclass
class FakeTree(Options):
    """`scalesgd data fake`: an ImageNet-like tree of real JPEGs whose classes a network can tell apart."""

    out: str = option("", "the folder to write train/ and val/ into", required=True, check=_empty_or_new)
    classes: int = option(10, "class folders", check=checks.within(1, 10_000))
    per_class: int = option(50, "training images per class", check=checks.within(1, 1_000_000))
    val_per_class: int = option(0, "validation images per class", shown_default="per-class ÷ 5, at least 1",
                                check=checks.at_least(0))
    size: str = option("375x500", "WIDTHxHEIGHT of every image (ImageNet's are about 400×350 to 500×375)",
                       check=_size)
    quality: int = option(90, "JPEG quality", check=checks.within(1, 100))
    seed: int = option(0, "seeds the noise in the images", check=checks.seed)


@dataclass
class ExportTree(Options):
    """`scalesgd data export`: a bundled dataset written as an image folder tree."""

    dataset: str = option("digits", "the dataset to write (digits: scikit-learn's 8×8 digits as greyscale PNGs, with "
                          "the in-memory dataset's train/test split as train/ and val/)", choices=EXPORTABLE,
                          positional="1", check_choices=False)
    out: str = option("", "the folder to write train/ and val/ into", required=True, check=_empty_or_new)

    def validate(self) -> ExportTree:
        """The positional DATASET named as typed (no --flag), before the options' own checks."""
        problem = _exportable(self.dataset)
        if problem:
            raise UsageError(f"DATASET {self.dataset!r} {problem}")
        return super().validate()


def fake(cfg: FakeTree, argv: list[str]) -> int:
    width, height = (int(v) for v in SIZE.match(cfg.size).groups())
    return _write(cfg.out, lambda out: write_fake_tree(out, cfg.classes, cfg.per_class, (width, height),
                                                       cfg.val_per_class or None, cfg.seed, cfg.quality))


def export(cfg: ExportTree, argv: list[str]) -> int:
    return _write(cfg.out, export_digits)


def _write(out: str, writer: Callable[[Path], dict]) -> int:
    """Write a tree into `out` (the writer moves it into place whole, or removes what it wrote): Ctrl-C ends it with
    one line and exit status 130, a folder that cannot be written is bad input naming it."""
    try:
        written = writer(Path(out))
    except KeyboardInterrupt:
        print(f"scalesgd: error: interrupted; nothing written to {out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as err:
        raise UsageError(f"`out` {out}: {_cannot_write(err)}; nothing written") from None
    return _said(out, written)


def _cannot_write(err: OSError) -> str:
    """What went wrong writing, in words."""
    if err.strerror is None:  # one of our own, with its message (a tree appeared meanwhile)
        return str(err)
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"cannot be written: permission denied ({err.filename})"
    return f"cannot be written: {err.strerror.lower()} ({err.filename})" if err.filename else \
        f"cannot be written: {err.strerror.lower()}"


def _said(out: str, written: dict) -> int:
    """One line of what was written, and where."""
    output.console().print(f"wrote {written['train']:,} training and {written['val']:,} validation images of "
                           f"{written['classes']} classes ({written['bytes'] / 1e6:.1f} MB) to {out}", highlight=False)
    return 0

