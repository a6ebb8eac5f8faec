"""The one console: whole table cells in logs and CI, the terminal's width on a terminal."""

import io
import os
import re

from scalesgd import output

LONG = ["halving_doubling-with-a-very-long-name", "scalesgd-fp8-flat-hierarchical-growing:4:2", "x" * 90]


def wide_table():
    return output.rich_table("allreduce, 64 workers", ["algorithm", "mode", "note", "median ms"],
                             [[*LONG, "12.345"], ["ring", "native", "short", "1.000"]])


def test_a_table_written_to_a_file_keeps_every_cell_whole(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    sink = io.StringIO()
    console = output.console(file=sink)
    assert not console.is_terminal
    console.print(wide_table())
    text = sink.getvalue()
    assert "…" not in text and all(cell in text for cell in LONG)
    assert max(map(len, text.splitlines())) > 80  # what rich's default of 80 columns would have cut


def test_an_inherited_columns_does_not_cut_a_table_off_a_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # what importing readline exports to every child process
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    sink = io.StringIO()
    output.console(file=sink).print(wide_table())
    assert "…" not in sink.getvalue() and all(cell in sink.getvalue() for cell in LONG)


def test_a_terminal_keeps_its_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd=0: os.terminal_size((60, 20)))
    sink = io.StringIO()
    console = output.console(file=sink, force_terminal=True)
    assert console.is_terminal and console.width == 60
    console.print(wide_table())
    text = re.sub(r"\x1b\[[0-9;]*m", "", sink.getvalue())  # a terminal gets colours
    assert max(map(len, text.splitlines())) <= 60 and "…" in text  # fits the terminal, cells shortened by rich


def test_a_log_axis_is_labelled_in_plain_numbers_not_typeset_math():
    plt = output.pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1e-3, 0.1, 10])
    output.log_scale(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    plt.close(fig)
    assert "1e-01".replace("-", "\N{MINUS SIGN}") in labels and not any("$" in label for label in labels)
