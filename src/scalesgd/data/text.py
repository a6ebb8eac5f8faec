"""Byte-level text for language-model training: a corpus every machine has, or a user's own file.

The default corpus is the Python standard library's own source code, read at run time from
``sysconfig.get_paths()["stdlib"]``: every Python install has it, so there is nothing to download,
no licence to fetch and no network needed, and it is real, structured text a small model can learn.
Files are taken in sorted relative-POSIX-path order and joined with ``SEPARATOR``, so the corpus is
the same bytes on every call with the same Python. Skipped, so the text stays ordinary library source:
third-party packages (``site-packages``, ``dist-packages``), test suites and their data (any folder
named ``test``, ``tests`` or ``idle_test``, and all of ``idlelib`` and ``lib2to3``, whose test data are
deliberately odd Python), generated tables (``encodings`` codec maps, ``pydoc_data`` topics),
``__pycache__`` and build support folders (``config-*``), and empty files.

A user's text (``--data-file``) is read as raw bytes in any encoding. Either way at most ``max_bytes``
bytes are used; the last 10 % by position is the validation split and the rest is training; each split
is cut into windows of T+1 bytes stepping by T (x = window[:-1], y = window[1:]); bytes left over at
the end of a split are dropped. The vocabulary is the 256 byte values.
"""

from __future__ import annotations

import os
import sysconfig
from numbers import Integral
from pathlib import Path

import numpy as np
import torch

from scalesgd.data.dataset import DataBundle, DataError, Split

DEFAULT_MAX_BYTES = 4_000_000  # about a tenth of the stdlib; loads in well under a second
VOCAB_SIZE = 256  # one token per byte value
VALIDATION_PERCENT = 10  # the last 10 % of the bytes, by position, is the validation split
SEPARATOR = b"\x00"  # between files of the stdlib corpus: a byte Python source never holds
EXCLUDED_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "test", "tests", "idle_test"})  # any depth
EXCLUDED_TOP = frozenset({"idlelib", "lib2to3", "encodings", "pydoc_data", "lib-dynload"})  # under the stdlib root


def min_text_bytes(sequence_length: int) -> int:
    """Fewest corpus bytes that give each split at least one window: 10·(T+1)."""
    return (sequence_length + 1) * 100 // VALIDATION_PERCENT


def check_text_file(path: str | Path, sequence_length: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> Path:
    """Cheaply confirm a user's text file is a readable, non-empty file long enough for `sequence_length`."""
    file = Path(path).expanduser()
    if not file.exists():
        raise DataError(f"text file not found: {file} (expected a file of raw text bytes)")
    if file.is_dir():
        raise DataError(f"text file {file} is a directory (expected a file of raw text bytes)")
    if not file.is_file():
        raise DataError(f"text file {file} is not a regular file (expected a file of raw text bytes)")
    try:
        with file.open("rb") as handle:
            handle.read(1)
        size = file.stat().st_size
    except OSError as error:
        raise DataError(f"cannot read text file {file}: {error.strerror or error}") from None
    if size == 0:
        raise DataError(f"empty text file {file} (expected at least 1 byte of text)")
    if sequence_length is not None:
        _check_length(min(size, max_bytes), sequence_length, max_bytes, f"text file {file}")
    return file


def stdlib_files() -> list[Path]:
    """The stdlib's own ordinary `*.py` files, sorted by relative POSIX path (see the module docstring)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        top_level = here == root
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS and not (top_level and (d in EXCLUDED_TOP or
                                                                                       d.startswith("config-")))]
        for name in files:
            if name.endswith(".py"):
                path = here / name
                found.append((path.relative_to(root).as_posix(), path))
    return [path for _, path in sorted(found)]


def stdlib_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The first `max_bytes` bytes of the stdlib files joined by SEPARATOR; unreadable and empty files skipped."""
    _check_int("max_bytes", max_bytes, 1)
    parts: list[bytes] = []
    total = 0
    for path in stdlib_files():
        if total >= max_bytes:
            break
        try:
            with path.open("rb") as handle:
                data = handle.read(max_bytes - total)
        except OSError:
            continue
        if not data:
            continue
        if parts:
            parts.append(SEPARATOR)
            total += len(SEPARATOR)
        parts.append(data)
        total += len(data)
    return b"".join(parts)[:max_bytes]


def text_train_size(data_file: str | Path | None, sequence_length: int, max_bytes: int = DEFAULT_MAX_BYTES,
                    samples: int | None = None) -> int:
    """Training windows `load_text_bundle` gives, from the file size alone for a user's file."""
    _check_args(sequence_length, max_bytes, samples)
    if data_file is not None:
        size = min(check_text_file(data_file, sequence_length, max_bytes).stat().st_size, max_bytes)
    else:
        size = len(stdlib_corpus(max_bytes))
        _check_length(size, sequence_length, max_bytes, "the stdlib corpus")
    train_bytes, _ = _split_sizes(size)
    return _cap((train_bytes - 1) // sequence_length, samples)


def load_text_bundle(data_file: str | Path | None, sequence_length: int, max_bytes: int = DEFAULT_MAX_BYTES,
                     samples: int | None = None) -> DataBundle:
    """Byte windows of a user's file (or the stdlib corpus when None): last 10 % validation, `samples` caps train."""
    _check_args(sequence_length, max_bytes, samples)
    if data_file is not None:
        file = check_text_file(data_file, sequence_length, max_bytes)
        try:
            with file.open("rb") as handle:
                data = handle.read(max_bytes)
        except OSError as error:
            raise DataError(f"cannot read text file {file}: {error.strerror or error}") from None
        source = f"text file {file}"
    else:
        data = stdlib_corpus(max_bytes)
        source = "the stdlib corpus"
    _check_length(len(data), sequence_length, max_bytes, source)
    corpus = np.frombuffer(data, dtype=np.uint8)
    train_bytes, _ = _split_sizes(len(corpus))
    train = _windows(corpus[:train_bytes], sequence_length, samples)
    test = _windows(corpus[train_bytes:], sequence_length, None)
    return DataBundle(train=train, test=test, num_classes=VOCAB_SIZE, in_channels=0, image_size=0, augment=False,
                      sequence_length=sequence_length)


def _windows(tokens: np.ndarray, sequence_length: int, samples: int | None) -> Split:
    """Cut bytes into windows of T+1 stepping by T; x and y are (N, T) views of one int64 tensor."""
    count = _cap((len(tokens) - 1) // sequence_length, samples)
    flat = torch.from_numpy(tokens[: count * sequence_length + 1].astype(np.int64))
    return Split(x=flat[:-1].view(count, sequence_length), y=flat[1:].view(count, sequence_length))


def _split_sizes(size: int) -> tuple[int, int]:
    """Bytes of the training and validation splits: validation is the last 10 %, rounded down."""
    validation = size * VALIDATION_PERCENT // 100
    return size - validation, validation


def _cap(count: int, samples: int | None) -> int:
    """`count` limited to `samples` when that is a positive number."""
    return min(count, samples) if samples else count


def _check_length(size: int, sequence_length: int, max_bytes: int, source: str) -> None:
    """Raise DataError unless `size` bytes give each split at least one window of T+1 bytes, naming the option that
    sets T (the GPT's `gpt_block`, the one model that reads text)."""
    need = min_text_bytes(sequence_length)
    if size >= need:
        return
    why = (f"the last tenth of the text is kept for validation and must hold one sequence of {sequence_length + 1} "
           f"bytes ({sequence_length} tokens and the one that follows them)")
    if max_bytes < need:
        raise DataError(f"max_bytes={max_bytes} is too small for `gpt_block` {sequence_length}: {source} needs at "
                        f"least {need} bytes, as {why}")
    raise DataError(f"{source} has {size} bytes; `gpt_block` {sequence_length} needs at least {need}, as {why}; give "
                    "a longer text or a smaller `gpt_block`")


def _check_args(sequence_length: int, max_bytes: int, samples: int | None) -> None:
    """Raise ValueError on a non-integer or out-of-range parameter."""
    _check_int("sequence_length", sequence_length, 1)
    _check_int("max_bytes", max_bytes, 1)
    if samples is not None:
        _check_int("samples", samples, 0)


def _check_int(name: str, value: object, low: int) -> None:
    """Raise ValueError unless `value` is an int >= `low`."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise ValueError(f"text {name} must be an int >= {low}, got {value!r}")
