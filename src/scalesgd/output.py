"""What every command writes: a JSON record, a Markdown table, a rich table through one console, a PNG."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import IO

import torch
from rich.console import Console
from rich.table import Table


def machine() -> dict:
    """The facts a reader needs to compare figures across machines."""
    return {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cuda": torch.cuda.is_available()}


def markdown_table(columns: list[str], rows: list[list]) -> str:
    """A Markdown table; a `|` inside a cell (|w| in a formula) is escaped, so it stays in its cell."""
    def cells(values) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |\n"

    return cells(columns) + "|" + "|".join("---" for _ in columns) + "|\n" + "".join(cells(row) for row in rows)


def rich_table(title: str, columns: list[str], rows: list[list]):
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    return table


def write_json(path: Path, record: dict) -> None:
    """A record as indented JSON, one file (run directories' config, summary, profile and decisions), whole or not at
    all."""
    write_whole(Path(path), json.dumps(record, indent=2) + "\n")


def write_whole(path: Path, data: str | bytes) -> None:
    """`data` (text as UTF-8) as the file `path`, whole or not at all: written beside it and renamed over it, so a
    kill or a full disk leaves the one before as it was (and processes writing it at once each replace it whole)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            temporary.write_text(data, encoding="utf-8")
        else:
            temporary.write_bytes(data)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write(out_dir: Path, name: str, record: dict, columns: list[str], rows: list[list], command: str) -> None:
    """<name>.json (every measurement) and <name>.md (the table and the command that produced it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {**record, "command": command, "machine": machine()}
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (out_dir / f"{name}.md").write_text(f"`{command}`\n\n" + markdown_table(columns, rows), encoding="utf-8")


UNCUT_WIDTH = 1000  # columns for output that is not a terminal: a table only takes the width it needs


def console(stderr: bool = False, file: IO[str] | None = None, force_terminal: bool | None = None) -> Console:
    """The console every command prints through, so that logs and CI keep every table cell whole."""
    made = Console(stderr=stderr, file=file, force_terminal=force_terminal)
    if made.is_terminal:
        return made  # the terminal's width
    # rich would take $COLUMNS or 80 and cut cells (`halving_dou…`); $COLUMNS is no guide off a terminal, as
    # importing readline (pytest, pdb, a Python shell) exports the terminal's width to every child process
    return Console(stderr=stderr, file=file, force_terminal=force_terminal, width=UNCUT_WIDTH)


def pyplot():
    """matplotlib's pyplot drawing to files only (no display is needed or opened)."""
    import matplotlib  # optional heavy dependency: loaded only by the commands that draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional heavy dependency, after choosing the file-only backend

    return plt


def log_scale(ax, **scale) -> None:
    """A log y axis labelled in plain numbers (1e-01, 1e-05): matplotlib's 10^k labels are typeset as math, whose
    parser took 1 s of the 1.5 s every run's report took to draw."""
    from matplotlib.ticker import LogFormatter  # optional heavy dependency, as pyplot()

    ax.set_yscale("log", **scale)
    ax.yaxis.set_major_formatter(LogFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
