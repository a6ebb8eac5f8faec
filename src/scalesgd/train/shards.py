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


def prune(run_dir: Path, keep: set[str]) -> None:
    """Remove the shard folders no checkpoint file names any longer (rank 0, after the file is in place)."""
    for folder in Path(run_dir).glob(f"{PREFIX}*"):
        if folder.is_dir() and folder.name not in keep:
            shutil.rmtree(folder, ignore_errors=True)
