"""Running `scalesgd bench …` as a user would, for the bench tests."""

import subprocess

from tests.command import scalesgd


def bench(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return scalesgd("bench", *argv, timeout=timeout)
