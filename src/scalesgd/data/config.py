"""`scalesgd train`'s data options: which dataset, where its files are and how its samples are made; and the
request a run makes of the dataset from them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from scalesgd import checks
from scalesgd.data import DATASETS, DataRequest
from scalesgd.options import option

AUGMENTS = ("standard", "none")
MAX_IMAGE_SIDE = 4096  # pixels: one such RGB image is 192 MiB as float32 (ImageNet's recipes crop to 224)
PATHS = ("data_dir", "data_file")  # options naming files, stored absolute so a run resumes from any folder
image_side = checks.within(1, MAX_IMAGE_SIDE, note="pixels a side; one such RGB image is 192 MiB as float32, and "
                           "ImageNet's recipes crop to 224")


def absolute(path: str | None) -> str | None:
    """A path as the folder it is typed in means it (~ expanded), so it means the same from anywhere."""
    return None if path is None else os.path.abspath(os.path.expanduser(path))


def absolute_paths(options: dict) -> dict:
    """Options by flat name, the data's files among them made absolute."""
    return {name: absolute(value) if name in PATHS else value for name, value in options.items()}


@dataclass
class DataConfig:
    """What a run trains and tests on."""

    dataset: str = option("digits", "the data trained and tested on", choices=DATASETS)
    data_dir: str | None = option(None, "folder holding the dataset's files (cifar10: cifar-10-batches-py; "
                                  "imagefolder: train/<class>/* and val/<class>/*, JPEG or PNG)", parse=str)
    data_file: str | None = option(None, "text: a file of your own to train on, read as bytes", parse=str,
                                   shown_default="the Python standard library's own sources")
    samples: int = option(5000, "synthetic: training samples; text: training sequences at most", check=checks.positive)
    image_size: int | None = option(None, "image side: synthetic images are made at it, imagefolder's are cropped "
                                    "to it", parse=int, shown_default="synthetic 32, imagefolder 224",
                                    check=lambda v: None if v is None else image_side(v))
    augment: str = option("standard", "standard: the dataset's training augmentation (cifar10: pad-4 crop and flip; "
                          "imagefolder: random-resized crop, area 8–100 %, aspect ¾–4/3, and flip, evaluated at a "
                          "256/224 resize and centre crop); none: the images as they are (imagefolder: resized to "
                          "--image-size and centre-cropped, for training and evaluation)", choices=AUGMENTS)
    skip_bad_images: bool = option(False, "imagefolder: leave out a file that is empty, truncated or no image, "
                                   "saying its path once and counting it in summary.json (default: stop, naming it)")
    loader_workers: int | None = option(None, "imagefolder: processes decoding images for each worker (0: in the "
                                        "worker itself)", parse=int, runtime=True,
                                        shown_default="the cores training leaves free, shared out, at least 1",
                                        check=lambda v: None if v is None else checks.at_least(0)(v))
    classes: int = option(10, "synthetic classes", check=checks.at_least(2, "classes to tell apart"))

    @property
    def text(self) -> bool:
        """Whether the run trains a language model on token sequences."""
        return DATASETS[self.dataset].text

    @property
    def side(self) -> int:
        """The image side: --image-size, else the dataset's own default."""
        return self.image_size or DATASETS[self.dataset].image_size

    def make_paths_absolute(self) -> None:
        """Store `data_dir` and `data_file` as absolute paths (once validated, so errors show them as typed): a run's
        config.json then names the same files when it is resumed from another folder."""
        self.data_dir, self.data_file = absolute(self.data_dir), absolute(self.data_file)

    def request(self, sequence_length: int, seed: int) -> DataRequest:
        """What the run asks of its dataset, for a model of `sequence_length` tokens and the run's seed."""
        return DataRequest(data_dir=self.data_dir, data_file=self.data_file, samples=self.samples,
                           image_size=self.side, num_classes=self.classes, sequence_length=sequence_length,
                           augment=self.augment != "none", skip_bad_images=self.skip_bad_images, seed=seed)
