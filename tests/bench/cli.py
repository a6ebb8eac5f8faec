"""Running `scalesgd bench …` as a user would, for the bench tests."""

import subprocess
import sys


def bench(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalesgd", "bench", *argv], capture_output=True, text=True,
                          timeout=timeout)
