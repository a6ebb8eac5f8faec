"""CIFAR-10 loader on tiny fake pickles: layout, normalisation, and one-line DataError messages."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from scalesgd.data import DataError, check_cifar10_dir, load_bundle, load_cifar10_bundle

PER_BATCH = 20
NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)


def write_batch(path: Path, data, labels, protocol: int = pickle.HIGHEST_PROTOCOL, **extra) -> None:
    batch = {b"batch_label": path.name.encode(), b"data": data, b"labels": labels, b"filenames": [], **extra}
    path.write_bytes(pickle.dumps(batch, protocol=protocol))


def make_fake_cifar(root: Path, protocol: int = pickle.HIGHEST_PROTOCOL) -> dict[str, tuple[np.ndarray, list[int]]]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in NAMES:
        data = rng.integers(0, 256, size=(PER_BATCH, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=PER_BATCH)]
        write_batch(folder / name, data, labels, protocol)
        written[name] = (data, labels)
    return written


def assert_one_line_naming(error: pytest.ExceptionInfo, fragment: str) -> None:
    message = str(error.value)
    assert "\n" not in message
    assert fragment in message


@pytest.fixture
def fake(tmp_path):
    return tmp_path, make_fake_cifar(tmp_path)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_loads_fake_pickles_with_expected_layout_and_normalisation(tmp_path, protocol):
    written = make_fake_cifar(tmp_path, protocol)
    bundle = load_cifar10_bundle(tmp_path)
    assert bundle.train.x.shape == (5 * PER_BATCH, 3, 32, 32) and bundle.test.x.shape == (PER_BATCH, 3, 32, 32)
    assert bundle.train.x.dtype == torch.float32 and bundle.train.y.dtype == torch.int64
    assert (bundle.num_classes, bundle.in_channels, bundle.image_size, bundle.augment) == (10, 3, 32, True)

    raw_train = np.concatenate([written[name][0] for name in NAMES[:5]])
    labels_train = sum((written[name][1] for name in NAMES[:5]), [])
    assert bundle.train.y.tolist() == labels_train
    assert bundle.test.y.tolist() == written["test_batch"][1]
    # Rows are channel-major (1024 red, 1024 green, 1024 blue), each 32x32 row-major.
    expected = (torch.from_numpy(raw_train).float().view(-1, 3, 32, 32) / 255 - MEAN) / STD
    assert torch.allclose(bundle.train.x, expected, atol=1e-5)
    red_pixel_row1_col2 = raw_train[0, 1 * 32 + 2]
    assert float(bundle.train.x[0, 0, 1, 2]) == pytest.approx((red_pixel_row1_col2 / 255 - 0.4914) / 0.2470, abs=1e-5)


def test_accepts_parent_or_the_batches_folder_itself(fake):
    root, _ = fake
    folder = root / "cifar-10-batches-py"
    assert check_cifar10_dir(root) == folder
    assert check_cifar10_dir(str(folder)) == folder
    assert torch.equal(load_cifar10_bundle(folder).train.x, load_cifar10_bundle(str(root)).train.x)


def test_load_bundle_dispatches_to_cifar10(fake):
    root, _ = fake
    assert len(load_bundle("cifar10", data_dir=root).test) == PER_BATCH
    with pytest.raises(DataError, match="data_dir") as error:
        load_bundle("cifar10")
    assert_one_line_naming(error, "cifar-10-batches-py")


def test_missing_folder(tmp_path):
    with pytest.raises(DataError) as error:
        check_cifar10_dir(tmp_path / "nowhere")
    assert_one_line_naming(error, str(tmp_path / "nowhere"))


@pytest.mark.parametrize("name", ["data_batch_3", "test_batch"])
def test_missing_file_named(fake, name):
    root, _ = fake
    (root / "cifar-10-batches-py" / name).unlink()
    for call in (check_cifar10_dir, load_cifar10_bundle):
        with pytest.raises(DataError) as error:
            call(root)
        assert_one_line_naming(error, str(root / "cifar-10-batches-py" / name))
        assert "missing" in str(error.value)


def test_empty_file_named(fake):
    root, _ = fake
    path = root / "cifar-10-batches-py" / "data_batch_2"
    path.write_bytes(b"")
    with pytest.raises(DataError) as error:
        check_cifar10_dir(root)
    assert_one_line_naming(error, str(path))
    assert "empty" in str(error.value)


@pytest.mark.parametrize("garbage", [b"this is not a pickle\n\nat all", b"\x80\x05\x95", pickle.dumps([1, 2])[:-3]])
def test_malformed_pickle_named(fake, garbage):
    root, _ = fake
    path = root / "cifar-10-batches-py" / "data_batch_4"
    path.write_bytes(garbage)
    check_cifar10_dir(root)  # the cheap check only looks at presence and size
    with pytest.raises(DataError) as error:
        load_cifar10_bundle(root)
    assert_one_line_naming(error, str(path))
    assert "not a valid pickle" in str(error.value)


class _Touch:
    """A pickle payload that would create a file if the loader executed arbitrary globals."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_pickle_cannot_run_code(fake):
    root, _ = fake
    path = root / "cifar-10-batches-py" / "test_batch"
    marker = root / "pwned"
    path.write_bytes(pickle.dumps({b"data": _Touch(marker), b"labels": []}))
    with pytest.raises(DataError) as error:
        load_cifar10_bundle(root)
    assert not marker.exists()
    assert_one_line_naming(error, str(path))
    assert "refusing to load global" in str(error.value)


GOOD = np.zeros((PER_BATCH, 3072), dtype=np.uint8)
GOOD_LABELS = [0] * PER_BATCH


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({b"labels": GOOD_LABELS}, "lacks key b'data'"),
        ({b"data": GOOD}, "lacks key b'labels'"),
        ({b"data": np.zeros((PER_BATCH, 100), np.uint8), b"labels": GOOD_LABELS}, "shape (N, 3072)"),
        ({b"data": GOOD.astype(np.float32), b"labels": GOOD_LABELS}, "uint8"),
        ({b"data": GOOD.tolist(), b"labels": GOOD_LABELS}, "uint8"),
        ({b"data": GOOD, b"labels": GOOD_LABELS[:-1]}, "expected 20 ints"),
        ({b"data": GOOD, b"labels": [0.5] * PER_BATCH}, "expected 20 ints"),
        ({b"data": GOOD, b"labels": [10] * PER_BATCH}, "expected 0..9"),
        ({b"data": GOOD, b"labels": 7}, "b'labels'"),
        ([GOOD, GOOD_LABELS], "expected a dict"),
    ],
)
def test_wrong_contents_named(fake, payload, fragment):
    root, _ = fake
    path = root / "cifar-10-batches-py" / "data_batch_5"
    path.write_bytes(pickle.dumps(payload))
    with pytest.raises(DataError) as error:
        load_cifar10_bundle(root)
    assert_one_line_naming(error, str(path))
    assert fragment in str(error.value)


def test_str_keys_are_accepted(fake):
    root, _ = fake
    path = root / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(pickle.dumps({"data": GOOD, "labels": GOOD_LABELS}))
    assert load_cifar10_bundle(root).test.y.tolist() == GOOD_LABELS


def test_data_error_is_a_value_error():
    assert issubclass(DataError, ValueError)
