"""Suite-wide settings."""

import os

# The fp8 kernels' compiled and eager paths give identical bytes (tests/comm/test_fp8.py checks it in
# a process of its own); every other test process uses eager torch rather than compiling for ~20 s.
os.environ.setdefault("SCALESGD_FP8_KERNELS", "eager")
# torchft's lighthouse logs a line for every quorum it is asked for; its warnings are what a test needs.
os.environ.setdefault("RUST_LOG", "warn")


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run where a GPU is present and are skipped, saying why, everywhere else."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
