"""The docs stay the current answer: docs/results.md holds at most 400 lines, its prose wrapped at 120 characters,
docs/benchmarks/ at most 8 MiB, a run's raw output lies there only packed (docs/benchmarks/README.md), and every
relative link in results.md resolves."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "results.md"
BENCHMARKS = DOCS / "benchmarks"
MOST_LINES = 400
MOST_CHARS = 120  # a prose line's width: a claim's detail goes to its folder's README.md, not onto one long line
MOST_BYTES = 8 * 2**20  # du -s --apparent-size's 8 MiB
RUN_OUTPUT = re.compile(r"(.*[-_])?metrics\.jsonl|report\.png")  # what a training run writes for itself
LINK = re.compile(r"\]\(([^)\s]+)\)")
LINK_ONLY = re.compile(r"!?\[[^\]]*\]\([^)\s]*\)")  # a line that is one link or image and nothing else


def files(folder: Path) -> list[Path]:
    return [Path(top) / name for top, _, names in os.walk(folder) for name in names]


def apparent_size(folder: Path) -> int:
    return sum(os.stat(path).st_size for path in files(folder))


def unpacked_run_output(folder: Path) -> list[str]:
    """Files a run writes (its metrics log, its report plot) lying in the tree rather than in an archive."""
    return sorted(str(path.relative_to(folder)) for path in files(folder) if RUN_OUTPUT.fullmatch(path.name))


def long_prose_lines(text: str) -> list[tuple[int, int]]:
    """(line number, length) of each line over MOST_CHARS that is prose: not a table row, a heading or a lone link."""
    return [(number, len(line)) for number, line in enumerate(text.splitlines(), 1)
            if len(line) > MOST_CHARS and not line.startswith(("|", "#")) and not LINK_ONLY.fullmatch(line.strip())]


def relative_links(text: str) -> list[str]:
    """The targets of markdown links and images that are paths: no scheme, not an anchor of the page itself."""
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:|#", target)]


def missing(text: str, base: Path) -> list[str]:
    return [target for target in relative_links(text) if not (base / target.split("#")[0]).exists()]


def test_results_md_is_at_most_400_lines():
    lines = len(RESULTS.read_text(encoding="utf-8").splitlines())
    assert lines <= MOST_LINES, f"docs/results.md has {lines} lines (at most {MOST_LINES}): history is git's"


def test_results_md_prose_is_wrapped_at_120_characters():
    long = long_prose_lines(RESULTS.read_text(encoding="utf-8"))
    assert long == [], (f"docs/results.md has prose lines over {MOST_CHARS} characters (line, length): {long[:10]}; "
                        "wrap them, and move a claim's detail to its benchmark folder's README.md")


def test_benchmarks_folder_is_at_most_8_mib():
    size = apparent_size(BENCHMARKS)
    assert size <= MOST_BYTES, (f"docs/benchmarks/ holds {size / 2**20:.2f} MiB (at most {MOST_BYTES / 2**20:.0f}): "
                                "pack runs into the folder's raw.tar.xz (docs/benchmarks/README.md)")


def test_no_run_log_lies_unpacked_under_benchmarks():
    loose = unpacked_run_output(BENCHMARKS)
    assert loose == [], f"per-run output outside an archive (pack it in its folder's raw.tar.xz): {loose[:10]}"


def test_every_relative_link_in_results_md_resolves():
    broken = missing(RESULTS.read_text(encoding="utf-8"), DOCS)
    assert broken == [], f"docs/results.md links to what is not there: {broken}"


def test_every_anchor_results_md_links_within_itself_is_there():
    text = RESULTS.read_text(encoding="utf-8")
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    linked = {target[1:] for target in LINK.findall(text) if target.startswith("#")}
    assert linked <= anchors, sorted(linked - anchors)


def test_the_checks_catch_what_they_guard(tmp_path):
    (tmp_path / "bench" / "run0").mkdir(parents=True)
    (tmp_path / "bench" / "run0" / "metrics.jsonl").write_text("{}\n" * 10)
    (tmp_path / "bench" / "rn50-metrics.jsonl").write_text("{}\n")
    (tmp_path / "bench" / "run0" / "report.png").write_bytes(b"png")
    (tmp_path / "bench" / "raw.tar.xz").write_bytes(b"xz")
    (tmp_path / "bench" / "train.json").write_text("{}")
    assert unpacked_run_output(tmp_path / "bench") == ["rn50-metrics.jsonl", "run0/metrics.jsonl", "run0/report.png"]
    assert apparent_size(tmp_path / "bench") == 30 + 3 + 3 + 2 + 2
    text = "[a](bench/train.json) [b](bench/gone.md#x) ![c](bench/) [d](https://x.org) [e](#here) `[f](nope)`"
    assert relative_links(text) == ["bench/train.json", "bench/gone.md#x", "bench/", "nope"]
    assert missing(text, tmp_path) == ["bench/gone.md#x", "nope"]
    lines = ["a" * 120, "b" * 121, "| " + "c" * 200, "## " + "d" * 200, f"![e]({'f' * 200}.png)", f"[g]({'h' * 200})",
             "- " + "i" * 119]
    assert long_prose_lines("\n".join(lines)) == [(2, 121), (7, 121)]
