"""One elastic member as a process: train, and turn how it ended into one line and an exit status its launcher
acts on (bad input and a refused configuration: 2, the whole run stops; the coordinator lost: 3, nothing to
restart; anything else: the launcher may restart this worker alone)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from scalesgd.config import TrainConfig
from scalesgd.data import DataError
from scalesgd.elastic.outcomes import CoordinatorLost, DivergedError, RefusedError, RunFinished, StateLost
from scalesgd.errors import (
    EXIT_NON_FINITE,
    EXIT_PEER_LOST,
    EXIT_USAGE,
    NonFiniteLoss,
    UsageError,
    as_flags,
)
from scalesgd.elastic.coordinator import Address
from scalesgd.runtime import launcher, process_group
from scalesgd.runtime.launcher import local_settings
from scalesgd.train import rundir
from scalesgd.train.elastic import ADDRESS_ENV, MEMBER_ENV, train_member

EXIT_COORDINATOR_LOST = EXIT_PEER_LOST


def run(run_dir: Path, cfg: TrainConfig | None = None) -> int:
    """Train as the member the environment names, with `cfg` (else the run directory's)."""
    name = os.environ.get(MEMBER_ENV, "w")
    try:
        train_member(cfg or rundir.read_config(run_dir), run_dir, os.environ[ADDRESS_ENV], name)
        return 0
    except (UsageError, DataError, RefusedError) as err:
        return _say(name, f"error: {err}", EXIT_USAGE)
    except CoordinatorLost as err:
        return _say(name, f"error: {err}", EXIT_COORDINATOR_LOST)
    except NonFiniteLoss as err:
        return _say(name, f"error: {err}; stopped, resume from the last checkpoint in {run_dir}", EXIT_NON_FINITE)
    except (DivergedError, StateLost) as err:
        return _say(name, f"error: {err}", 1)
    except RunFinished as err:  # torchrun restarted it at the run's end: done, as the others are
        return _say(name, str(err), 0)


def run_under_torchrun(cfg: TrainConfig) -> int:
    """This torchrun process as one member of the elastic run at `cfg`'s `--join` address, named by its host and
    rank: torchrun (`--max-restarts`) restarts a host's processes when one fails, and each rejoins at a round
    boundary and heals from a peer, as a member our launcher restarts does. The run directory is `--run-dir`, else
    runs/torchrun-<its run id>, shared by the host's members (the round's first member writes the records)."""
    run_dir = Path(cfg.output.run_dir or f"runs/torchrun-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.output.run_dir = str(run_dir)
    rundir.write_config(cfg, run_dir)  # the same on every process of the launch: written whole by each
    launch = os.environ.get("TORCHELASTIC_RUN_ID", "")[:8]  # two launches on one host apart
    member = {ADDRESS_ENV: cfg.periodic.join, MEMBER_ENV: f"{socket.gethostname()}-{launch}-r{os.environ['RANK']}"}
    os.environ.update(local_settings({**os.environ, **member}, int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                                     Address.parse(cfg.periodic.join).store_host))  # gloo on loopback for 127.x
    return run(run_dir, cfg)


def _say(name: str, line: str, code: int) -> int:
    print(f"scalesgd: worker {name}: {as_flags(line)}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalesgd.train.elastic_worker")
    parser.add_argument("run_dir", type=Path)
    return run(parser.parse_args(argv).run_dir)


if __name__ == "__main__":
    launcher.join_launcher()
    process_group.exit_process(main())
