"""CIFAR-10 from the standard python pickles, validated so a bad file fails with one clear line."""

from __future__ import annotations

import codecs
import pickle
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

try:  # numpy's array reconstruction, which CIFAR-10's pickles name, moved to numpy._core in numpy 2
    from numpy._core import multiarray, numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray, numeric  # type: ignore[no-redef]

from scalesgd.data.dataset import DataBundle, DataError, Split, not_a_folder

FOLDER_NAME = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
ALL_FILES = TRAIN_FILES + (TEST_FILE,)
TRAIN_SIZE = 50_000
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
NUM_CLASSES = 10
IMAGE_SIZE = 32
CHANNELS = 3
ROW_LENGTH = CHANNELS * IMAGE_SIZE * IMAGE_SIZE


def check_cifar10_dir(data_dir: str | Path) -> Path:
    """Cheaply confirm the six CIFAR-10 batch files are present and non-empty; return their folder."""
    root = Path(data_dir).expanduser()
    folder = root / FOLDER_NAME if (root / FOLDER_NAME).is_dir() else root
    if not folder.is_dir():
        raise not_a_folder(folder, "CIFAR-10 folder", f"a directory that is, or contains, {FOLDER_NAME}/")
    for name in ALL_FILES:
        path = folder / name
        if not path.is_file():
            raise DataError(f"missing CIFAR-10 file {path} (expected {', '.join(ALL_FILES)} in {folder})")
        if path.stat().st_size == 0:
            raise DataError(f"empty CIFAR-10 file {path} (expected a non-empty python pickle batch)")
    return folder


def load_cifar10_bundle(data_dir: str | Path) -> DataBundle:
    """Load all six batches, scale to [0, 1] and normalise with the usual per-channel CIFAR mean/std."""
    folder = check_cifar10_dir(data_dir)
    train_parts = [_read_batch(folder / name) for name in TRAIN_FILES]
    test_x, test_y = _read_batch(folder / TEST_FILE)
    train_x = np.concatenate([x for x, _ in train_parts])
    train_y = np.concatenate([y for _, y in train_parts])
    return DataBundle(
        train=Split(x=_normalise(train_x), y=torch.from_numpy(train_y)),
        test=Split(x=_normalise(test_x), y=torch.from_numpy(test_y)),
        num_classes=NUM_CLASSES,
        in_channels=CHANNELS,
        image_size=IMAGE_SIZE,
        augment=True,
    )


def _normalise(rows: np.ndarray) -> torch.Tensor:
    """uint8 (N, 3072) rows to float32 (N, 3, 32, 32), scaled to [0, 1] then per-channel standardised."""
    x = torch.from_numpy(rows).reshape(-1, CHANNELS, IMAGE_SIZE, IMAGE_SIZE).to(torch.float32)
    x.div_(255.0)
    x.sub_(torch.tensor(MEAN).view(1, CHANNELS, 1, 1)).div_(torch.tensor(STD).view(1, CHANNELS, 1, 1))
    return x


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Unpickle one batch file and return its (N, 3072) uint8 rows and (N,) int64 labels."""
    try:
        with path.open("rb") as handle:
            batch = _SafeUnpickler(handle, encoding="bytes").load()
    except Exception as exc:  # pickle raises many types (UnpicklingError, EOFError, ValueError, ...)
        raise DataError(
            f"CIFAR-10 file {path} is not a valid pickle ({type(exc).__name__}: {_one_line(exc)}); "
            "expected a python pickle batch"
        ) from exc
    if not isinstance(batch, dict):
        raise DataError(f"CIFAR-10 file {path} holds a {type(batch).__name__}, expected a dict with b'data' and b'labels'")
    data = _lookup(batch, "data", path)
    labels = _lookup(batch, "labels", path)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != ROW_LENGTH:
        found = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"CIFAR-10 file {path} has b'data' as {found}, expected a uint8 array of shape (N, {ROW_LENGTH})")
    try:
        label_array = np.asarray(labels) if len(labels) else np.zeros(0, dtype=np.int64)
    except Exception as exc:
        raise DataError(f"CIFAR-10 file {path} has unreadable b'labels', expected a list of ints") from exc
    if label_array.ndim != 1 or label_array.shape[0] != data.shape[0] or not np.issubdtype(label_array.dtype, np.integer):
        raise DataError(
            f"CIFAR-10 file {path} has b'labels' of shape {label_array.shape} and dtype {label_array.dtype}, "
            f"expected {data.shape[0]} ints (one per row of b'data')"
        )
    if label_array.size and (label_array.min() < 0 or label_array.max() >= NUM_CLASSES):
        raise DataError(
            f"CIFAR-10 file {path} has labels in [{label_array.min()}, {label_array.max()}], expected 0..{NUM_CLASSES - 1}"
        )
    return np.ascontiguousarray(data), label_array.astype(np.int64)


def _lookup(batch: dict, key: str, path: Path) -> Any:
    """Fetch `key` from a batch dict, accepting bytes keys (the standard files) or str keys."""
    for candidate in (key.encode(), key):
        if candidate in batch:
            return batch[candidate]
    found = ", ".join(sorted(map(repr, batch))[:8]) or "none"
    raise DataError(f"CIFAR-10 file {path} lacks key b'{key}' (found keys: {found})")


def _one_line(exc: BaseException) -> str:
    """First line of an exception message, so DataError messages stay one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no details"


def _numpy_globals() -> MappingProxyType:
    """The only globals a CIFAR-10 batch pickle needs: numpy array reconstruction and bytes decoding."""
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }
    for module in ("numpy.core", "numpy._core"):
        allowed[(f"{module}.multiarray", "_reconstruct")] = multiarray._reconstruct
        allowed[(f"{module}.numeric", "_frombuffer")] = numeric._frombuffer
    return MappingProxyType(allowed)


class _SafeUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global except numpy array rebuilding, so a data file cannot run code."""

    _allowed = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}") from None
