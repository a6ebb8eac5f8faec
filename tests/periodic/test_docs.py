"""docs/periodic.md as a user reads it: the codecs it names are the registered ones DiLoCo builds, it says how a
codec's density is set, and that fp8's kernels compile (and how not to wait for it)."""

import re
from pathlib import Path

from scalesgd.comm.codecs import CODECS

DOC = Path(__file__).resolve().parents[2] / "docs" / "periodic.md"


def test_the_periodic_docs_name_registered_codecs_their_density_and_fp8s_compile():
    text = DOC.read_text(encoding="utf-8")
    named = re.findall(r'codec="([^"]+)"', text) + re.findall(r"--codec ([a-z0-9-]+)", text)
    assert named and all(name in CODECS and CODECS[name].build is not None for name in named), named
    assert "top-k\"" not in text and 'codec="top-k"' not in text
    assert "settings=CodecSettings(TopkOptions(density=" in text  # how a density is given in a loop of one's own
    assert "SCALESGD_FP8_KERNELS=eager" in text and "compile" in text
