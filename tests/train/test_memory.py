"""What a rank holds: the resident set before training is measured as it is now, so a peak's training part is known."""

import torch

from scalesgd.train import memory


def test_the_resident_set_grows_by_a_touched_tensor_and_falls_when_it_is_freed():
    before = memory.resident_bytes()
    held = torch.ones(64 * memory.MB // 4)  # 64 MiB, every page written
    grown = memory.resident_bytes() - before
    del held
    assert 60 * memory.MB <= grown <= 80 * memory.MB
    assert memory.resident_bytes() < before + grown / 2  # a large block goes back to the system: "now", not a peak
