"""A sharded run's checkpoint folders: each rank writes its own shards through `torch.distributed.checkpoint` beside
the small checkpoint file that names the folder, so no rank ever holds the whole model, and a run resumes on any
number of workers (the shards are laid out again from their global offsets)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch.distributed.checkpoint as dcp

from scalesgd.runtime.process_group import DistEnv

PREFIX = "shards-"


def folder_name(epoch: int, step: int) -> str:
    """The folder of the checkpoint taken at `epoch` (and `step` steps into the next)."""
    return f"{PREFIX}{epoch}-{step}"


def save(state: dict, folder: Path, env: DistEnv) -> None:
    """Every rank's shards of `state` into `folder` (collective); a folder left by a write that was cut off is
    replaced: only the checkpoint file written after this names a folder."""
    if env.is_main and folder.exists():
        shutil.rmtree(folder)
    env.members.barrier()
    dcp.save(state, checkpoint_id=folder)


def problem(folder: Path) -> str | None:
    """What makes a checkpoint's shard folder unreadable (missing, no metadata, a shard file cut short), or None:
    found before any worker starts, so a damaged one is one line rather than every rank's traceback."""
    if not folder.is_dir():
        return f"its shard folder {folder.name} is missing"
    try:
        stored = dcp.FileSystemReader(folder).read_metadata().storage_data
    except Exception as err:  # noqa: BLE001 (any unreadable metadata is a damaged checkpoint)
        return f"its shard folder {folder.name} has no readable metadata ({type(err).__name__})"
    needed: dict[str, int] = {}
    for info in stored.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        have = (folder / name).stat().st_size if (folder / name).is_file() else None
        if have is None or have < size:
            held = "missing" if have is None else f"{have:,} of its {size:,} bytes"
            return f"its shard file {folder.name}/{name} is cut short ({held})"
    return None
