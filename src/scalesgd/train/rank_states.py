"""Each rank's own state at a checkpoint (a codec's residuals, a periodic replica's local parameters and inner
optimizer), written by that rank into a folder the checkpoint file names: none of it crosses the link to rank 0
(a periodic GPT's 16.7 MB a rank did, 13 s a checkpoint at 10 Mbit/s)."""

from __future__ import annotations

import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from scalesgd.runtime.process_group import DistEnv

PREFIX = "ranks-"


def folder_name(epoch: int, step: int) -> str:
    """The folder of the checkpoint taken at `epoch` (and `step` steps into the next)."""
    return f"{PREFIX}{epoch}-{step}"


def file_name(rank: int) -> str:
    return f"rank{rank}.pt"


def save(state: dict, folder: Path, env: DistEnv, write: Callable[[dict, Path], None]) -> None:
    """This rank's `state` into `folder` through `write` (atomic), collectively: when it returns every rank's file is
    whole, so the checkpoint file written next may name the folder; a folder left by a cut-off write is replaced."""
    if env.is_main and folder.exists():
        shutil.rmtree(folder)
    env.members.barrier()
    folder.mkdir(parents=True, exist_ok=True)
    write(state, folder / file_name(env.rank))
    env.members.barrier()


def load(folder: Path, rank: int) -> dict:
    return torch.load(folder / file_name(rank), map_location="cpu", weights_only=True)


def problem(folder: Path, ranks: int) -> str | None:
    """What makes a checkpoint's rank folder unreadable (missing, a rank's file missing or empty), or None."""
    if not folder.is_dir():
        return f"its rank folder {folder.name} is missing"
    for rank in range(ranks):
        path = folder / file_name(rank)
        if not path.is_file():
            return f"its rank file {folder.name}/{path.name} is missing"
        try:
            zipfile.ZipFile(path).close()  # torch.save's archive: its directory is at the end, so a cut reads wrong
        except (zipfile.BadZipFile, OSError):
            return f"its rank file {folder.name}/{path.name} is cut short ({path.stat().st_size:,} bytes)"
    return None
