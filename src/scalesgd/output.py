"""What every benchmark writes: a JSON record, a Markdown table and a rich table on the terminal."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch
from rich.table import Table


def machine() -> dict:
    """The facts a reader needs to compare figures across machines."""
    return {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cuda": torch.cuda.is_available()}


def markdown_table(columns: list[str], rows: list[list]) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "|".join("---" for _ in columns) + "|\n"
    return head + "".join("| " + " | ".join(str(c) for c in row) + " |\n" for row in rows)


def rich_table(title: str, columns: list[str], rows: list[list]):
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    return table


def write(out_dir: Path, name: str, record: dict, columns: list[str], rows: list[list], command: str) -> None:
    """<name>.json (every measurement) and <name>.md (the table and the command that produced it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {**record, "command": command, "machine": machine()}
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (out_dir / f"{name}.md").write_text(f"`{command}`\n\n" + markdown_table(columns, rows), encoding="utf-8")


def pyplot():
    """matplotlib's pyplot drawing to files only (no display is needed or opened)."""
    import matplotlib  # optional heavy dependency: loaded only by the commands that draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional heavy dependency, after choosing the file-only backend

    return plt
