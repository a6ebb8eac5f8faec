"""Suite-wide settings."""

import os

# The fp8 kernels' compiled and eager paths give identical bytes (tests/comm/test_fp8.py checks it in
# a process of its own); every other test process uses eager torch rather than compiling for ~20 s.
os.environ.setdefault("SCALESGD_FP8_KERNELS", "eager")
