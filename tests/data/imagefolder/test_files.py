"""Images decoded on demand: the same crop for a sample whichever process decodes it, bad files named or replaced."""

from pathlib import Path

import pytest
import torch

from scalesgd.data import BadImage, load_image_folder
from scalesgd.data.imagefolder.files import ImageFiles, channel_stats, check_batch, collate
from scalesgd.data.imagefolder.scan import index_image_folder
from scalesgd.data.imagefolder.trees import write_fake_tree


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    write_fake_tree(root, 2, 4, (30, 24), val_per_class=2)
    return root


def test_a_sample_s_crop_depends_on_seed_epoch_and_index_only(root):
    index = index_image_folder(root)
    files = ImageFiles(index.train, 3, 16, "train", seed=5)
    again = ImageFiles(index.train, 3, 16, "train", seed=5)
    assert torch.equal(files[(1, 3)].x, again[(1, 3)].x)  # a fresh object, as another loader process would be
    assert not torch.equal(files[(1, 3)].x, files[(2, 3)].x)  # a new epoch, a new crop
    assert not torch.equal(files[(1, 3)].x, ImageFiles(index.train, 3, 16, "train", seed=6)[(1, 3)].x)
    assert files[(0, 3)].x.shape == (3, 16, 16) and files[(0, 3)].x.dtype == torch.uint8


def test_a_truncated_file_is_named_or_replaced_by_the_next_one(tmp_path, root):
    index = index_image_folder(root)
    bad = tmp_path / "cut.JPEG"
    bad.write_bytes(Path(index.train[1][0]).read_bytes()[:300])  # the header survives: only decoding finds it
    files = index.train[:1] + [(str(bad), 0)] + index.train[2:]
    strict = collate([ImageFiles(files, 3, 16, "eval")[i] for i in range(3)])
    with pytest.raises(BadImage, match=f"{bad}: cannot be decoded .*`skip_bad_images`"):
        check_batch(strict, skip_bad=False)
    lenient = ImageFiles(files, 3, 16, "eval", skip_bad=True)
    sample = lenient[1]
    assert torch.equal(sample.x, lenient[2].x) and sample.y == files[2][1]  # the next file in its place
    assert check_batch(collate([sample]), skip_bad=True) == [sample.problem] and str(bad) in sample.problem


def test_normalisation_statistics_are_the_pixels_mean_and_deviation(root):
    index = index_image_folder(root)
    files = ImageFiles(index.train, 3, 16, "eval")
    pixels = torch.stack([files[i].x for i in range(len(files))]).double().div(255)
    mean, std = channel_stats(files)
    torch.testing.assert_close(torch.tensor(mean, dtype=torch.float64), pixels.mean((0, 2, 3)))
    torch.testing.assert_close(torch.tensor(std, dtype=torch.float64), pixels.std((0, 2, 3), correction=0))
    data = load_image_folder(root, 16)
    assert (data.num_classes, data.in_channels, len(data.train), len(data.test)) == (2, 3, 8, 4)
    assert (data.train.transform, data.test.transform) == ("train", "eval")
    assert load_image_folder(root, 16, augment=False).train.transform == "plain"
