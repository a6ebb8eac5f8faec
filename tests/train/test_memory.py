"""What a rank holds: the resident set before training is measured as it is now, so a peak's training part is known."""

import subprocess
import sys

# in an interpreter of its own: the suite's process has freed memory its allocator may hand back already resident
PROBE = """
import torch
from scalesgd.train import memory
before = memory.resident_bytes()
held = torch.ones(64 * memory.MB // 4)  # 64 MiB, every page written
grown = memory.resident_bytes() - before
del held
print(grown / memory.MB, (memory.resident_bytes() - before) / memory.MB)
"""


def test_the_resident_set_grows_by_a_touched_tensor_and_falls_when_it_is_freed():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    grown, after = map(float, done.stdout.split())
    assert 60 <= grown <= 80
    assert after < grown / 2  # a large block goes back to the system: "now", not a peak
