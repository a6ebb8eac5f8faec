"""Byte-level text: the stdlib corpus, user files, the fixed split, windows, and text Split/DataBundle checks."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from scalesgd.data.dataset import DataBundle, DataError, Split
from scalesgd.data.text import (
    DEFAULT_MAX_BYTES,
    SEPARATOR,
    VOCAB_SIZE,
    check_text_file,
    load_text_bundle,
    min_text_bytes,
    stdlib_corpus,
    stdlib_files,
    text_train_size,
)

T = 16
SMALL = 20_000  # bytes of the stdlib corpus most tests use, to stay fast


def flat(split: Split) -> torch.Tensor:
    """The bytes a split's windows cover, in order: every x row, then the last target."""
    return torch.cat([split.x.reshape(-1), split.y[-1, -1:]])


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def corpus_tensor(data: bytes) -> torch.Tensor:
    return torch.tensor(list(data), dtype=torch.int64)


def test_stdlib_corpus_is_deterministic():
    first, second = load_text_bundle(None, T, SMALL), load_text_bundle(None, T, SMALL)
    for a, b in ((first.train, second.train), (first.test, second.test)):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert stdlib_corpus(SMALL) == stdlib_corpus(SMALL)


def test_stdlib_files_sorted_and_filtered():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    relative = [p.relative_to(root).as_posix() for p in files]
    assert relative == sorted(relative) and len(relative) > 100
    for rel in relative:
        parts = rel.split("/")
        assert rel.endswith(".py")
        assert not {"site-packages", "__pycache__", "test", "tests", "idle_test"} & set(parts[:-1]), rel
        assert parts[0] not in {"idlelib", "lib2to3", "encodings", "pydoc_data"}, rel


def test_corpus_starts_with_the_alphabetically_first_file():
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "encodings", "pydoc_data"}
    candidates = sorted(p.relative_to(root).as_posix() for p in [*root.glob("*.py"), *root.glob("*/*.py")]
                        if p.parent.name not in skip and p.stat().st_size)
    first = (root / candidates[0]).read_bytes()
    corpus = stdlib_corpus(len(first) + 1 + 100)
    assert corpus[: len(first)] == first
    assert corpus[len(first) : len(first) + 1] == SEPARATOR
    assert len(corpus) == len(first) + 1 + 100
    bundle = load_text_bundle(None, T, SMALL)
    assert bundle.train.x[0].tolist() == list(first[:T])


def test_default_corpus_size_and_shape():
    bundle = load_text_bundle(None, 128)
    assert bundle.is_text and bundle.num_classes == VOCAB_SIZE == 256 and bundle.sequence_length == 128
    assert bundle.train.x.dtype == torch.int64 and bundle.train.x.shape[1] == 128
    covered = (len(bundle.train) + len(bundle.test)) * 128
    assert DEFAULT_MAX_BYTES - 2 * 129 < covered <= DEFAULT_MAX_BYTES
    assert text_train_size(None, 128) == len(bundle.train)


def test_split_is_fixed_by_position_and_windows_tile_the_bytes():
    data = stdlib_corpus(SMALL)
    tokens = corpus_tensor(data)
    bundle = load_text_bundle(None, T, SMALL)
    train_bytes = len(data) - len(data) // 10
    # y is x shifted by one, and windows step by T, so consecutive windows share only the boundary byte
    for split in (bundle.train, bundle.test):
        assert torch.equal(split.y[:, :-1], split.x[:, 1:])
        assert torch.equal(split.y[:-1, -1], split.x[1:, 0])
    train, test = flat(bundle.train), flat(bundle.test)
    assert torch.equal(train, tokens[: len(train)])  # training starts at byte 0
    assert len(train) <= train_bytes < len(train) + T  # leftover train bytes dropped, fewer than one step
    assert torch.equal(test, tokens[train_bytes : train_bytes + len(test)])  # validation starts at the 90 % mark
    assert len(data) - train_bytes - len(test) < T


def test_user_file_loads_any_bytes(tmp_path):
    payload = bytes(range(256)) * 4 + "héllo wörld\n".encode("latin-1")
    path = tmp_path / "corpus.bin"
    path.write_bytes(payload)
    bundle = load_text_bundle(str(path), T)
    tokens = corpus_tensor(payload)
    train_bytes = len(payload) - len(payload) // 10
    assert torch.equal(flat(bundle.train), tokens[: len(flat(bundle.train))])
    assert torch.equal(flat(bundle.test), tokens[train_bytes : train_bytes + len(flat(bundle.test))])
    assert len(bundle.train) == (train_bytes - 1) // T == text_train_size(path, T)
    assert int(bundle.train.x.max()) == 255
    capped = load_text_bundle(path, T, max_bytes=500)
    assert torch.equal(flat(capped.train), tokens[: len(flat(capped.train))])
    assert len(capped.train) == (450 - 1) // T == text_train_size(path, T, max_bytes=500)


def test_sample_cap(tmp_path):
    full = load_text_bundle(None, T, SMALL)
    capped = load_text_bundle(None, T, SMALL, samples=7)
    assert len(capped.train) == 7 == text_train_size(None, T, SMALL, samples=7)
    assert torch.equal(capped.train.x, full.train.x[:7]) and torch.equal(capped.train.y, full.train.y[:7])
    assert len(capped.test) == len(full.test)
    for samples in (None, 0, 10**9):
        assert len(load_text_bundle(None, T, SMALL, samples=samples).train) == len(full.train)
    with pytest.raises(ValueError, match="samples"):
        load_text_bundle(None, T, SMALL, samples=-1)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: d / "missing.txt", "not found"),
        (lambda d: written(d / "empty.txt", b""), "empty text file"),
        (lambda d: written(d / "short.txt", b"x" * 169), "has 169 bytes; `gpt_block` 16 needs at least 170, as "),
        (lambda d: d, "is a directory"),
    ],
)
def test_bad_user_files_raise_one_line(tmp_path, make, fragment):
    path = make(tmp_path)
    for call in (lambda: check_text_file(path, T), lambda: load_text_bundle(str(path), T),
                 lambda: text_train_size(path, T)):
        with pytest.raises(DataError, match=fragment) as error:
            call()
        assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_too_small_max_bytes_names_it():
    assert min_text_bytes(T) == 170
    with pytest.raises(DataError, match="max_bytes=100 is too small") as error:
        load_text_bundle(None, T, max_bytes=100)
    assert "\n" not in str(error.value)
    assert len(load_text_bundle(None, T, max_bytes=170).test) == 1


def text_split(n: int = 3, t: int = 4, high: int = 256) -> Split:
    tokens = torch.arange(n * t + 1) % high
    return Split(x=tokens[:-1].view(n, t), y=tokens[1:].view(n, t))


def text_bundle(train: Split | None = None, test: Split | None = None, **overrides) -> DataBundle:
    fields = {"num_classes": 256, "in_channels": 0, "image_size": 0, "augment": False, "sequence_length": 4}
    fields.update(overrides)
    return DataBundle(train=train or text_split(), test=test or text_split(1), **fields)


def test_text_split_and_bundle_accept_token_sequences():
    split = text_split()
    assert split.is_text and len(split) == 3
    bundle = text_bundle()
    assert bundle.is_text and bundle.sequence_length == 4 and bundle.num_classes == 256


@pytest.mark.parametrize(
    ("x", "y", "fragment"),
    [
        (torch.zeros(3, 4, dtype=torch.int32), torch.zeros(3, 4, dtype=torch.int64), "Split.x"),
        (torch.zeros(3, 4, dtype=torch.int64), torch.zeros(3, 4, dtype=torch.int32), r"Split.y .*\(3, 4\)"),
        (torch.zeros(3, 4, dtype=torch.int64), torch.zeros(3, 5, dtype=torch.int64), r"Split.y .*\(3, 4\)"),
        (torch.zeros(3, 4, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), r"Split.y .*\(3, 4\)"),
        (torch.zeros(3, 0, dtype=torch.int64), torch.zeros(3, 0, dtype=torch.int64), "T >= 1"),
    ],
)
def test_text_split_rejects_malformed_tensors(x, y, fragment):
    with pytest.raises(DataError, match=fragment) as error:
        Split(x=x, y=y)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"train": text_split(n=80, high=300)}, r"train.x has tokens in \[0, 299\], expected tokens in \[0, 255\]"),
        ({"num_classes": 10}, r"train.x has tokens in \[0, 11\], expected tokens in \[0, 9\]"),
        ({"test": Split(x=-torch.ones(1, 4, dtype=torch.int64), y=torch.zeros(1, 4, dtype=torch.int64))},
         "test.x has tokens"),
        ({"test": Split(x=torch.zeros(1, 4, dtype=torch.int64), y=torch.full((1, 4), 256))}, "test.y has tokens"),
        ({"sequence_length": 5}, r"expected an int64 tensor of shape \(N, 5\)"),
        ({"test": Split(x=torch.zeros(1, 1, 2, 2), y=torch.zeros(1, dtype=torch.int64))}, "test.x is"),
        ({"image_size": 32}, "image_size=0"),
        ({"augment": True}, "augment=False"),
        ({"sequence_length": -1}, "sequence_length must be >= 0"),
        ({"sequence_length": 0, "in_channels": 1, "image_size": 2}, "set sequence_length"),
    ],
)
def test_text_bundle_validation(kwargs, fragment):
    with pytest.raises(DataError, match=fragment) as error:
        text_bundle(**kwargs)
    assert "\n" not in str(error.value)


def test_image_bundle_is_not_text():
    x = torch.zeros(2, 1, 3, 3)
    split = Split(x=x, y=torch.zeros(2, dtype=torch.int64))
    bundle = DataBundle(split, split, 2, 1, 3, False)
    assert not split.is_text and not bundle.is_text and bundle.sequence_length == 0
