"""The README stays short: each cell of its results table says its figure in 40 words at most (a link carries the
rest), and every figure it quotes from docs/results.md links to where results.md gives it."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
MOST_WORDS = 40


def words(cell: str) -> int:
    """Words a reader reads: a link counts as its text, not its address."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell)
    return len(text.split())


def claim_rows(text: str) -> list[list[str]]:
    """The cells of each row of the README's `| claim | figure |` table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| claim | figure |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_each_claim_cell_is_forty_words_at_most():
    rows = claim_rows(README.read_text())
    assert len(rows) >= 5
    long = [(cell[:50], words(cell)) for row in rows for cell in row if words(cell) > MOST_WORDS]
    assert long == [], f"README cells over {MOST_WORDS} words (move the rest behind the link): {long}"


def test_every_claim_links_to_an_anchor_results_md_has():
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', RESULTS.read_text()))
    linked = re.findall(r"\(docs/results\.md#([^)]+)\)", README.read_text())
    assert linked and set(linked) <= anchors, sorted(set(linked) - anchors)


def test_the_word_count_reads_links_as_their_text():
    assert words("[a b](docs/results.md#x) c") == 3
