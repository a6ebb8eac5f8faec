"""One training worker: join the group, train, and turn failures into one line and an exit status; and
starting such workers on this machine."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from scalesgd.comm.wire.collectives import broadcast_object
from scalesgd.config import TrainConfig
from scalesgd.data import BadImage, DataError
from scalesgd.data.pipeline import DataGone, loader_death
from scalesgd.errors import (
    EXIT_NON_FINITE,
    EXIT_USAGE,
    NoDevice,
    NonFiniteLoss,
    UsageError,
    as_flags,
)
from scalesgd.runtime import heartbeat, launcher, process_group
from scalesgd.train import elastic_launch, rundir
from scalesgd.train.checkpoint import NoSpace
from scalesgd.train.loop import train
from scalesgd.train.rundir import CHECKPOINT_NAME, disk_full


def spawn(cfg: TrainConfig, run_dir: Path, resume: bool) -> int:
    """Train on `cfg.runtime.workers` local processes; the last checkpoint survives an interruption, and a lost worker
    restarts the group from it `cfg.runtime.max_restarts` times at most."""
    def args(resume: bool) -> list[str]:
        return ["-m", "scalesgd.train.worker", str(run_dir)] + (["--resume"] if resume else [])

    def restart(attempt: int) -> list[str]:
        resume = (run_dir / CHECKPOINT_NAME).exists()
        print(f"scalesgd: restarting the workers from {'the last checkpoint' if resume else 'the start'} "
              f"(restart {attempt} of {cfg.runtime.max_restarts})", file=sys.stderr)
        return args(resume)

    if cfg.periodic.elastic or cfg.periodic.join:
        return elastic_launch.spawn(cfg, run_dir)
    rt = cfg.runtime
    return launcher.spawn(args(resume), rt.workers, rt.master_addr, rt.master_port, rt.timeout, rt.max_restarts,
                          restart)


def run(cfg: TrainConfig, run_dir: Path | None, resume: bool) -> int:
    """Train on this rank; `run_dir` None means rank 0 chooses it (torchrun, where ranks may disagree)."""
    rank = int(os.environ.get("RANK", "0"))
    pending = None
    try:
        pending = process_group.start_init(cfg.runtime.timeout, cfg.runtime.threads,
                                           exchange_group=cfg.exchange.own_group, procs_per_node=procs_per_node(cfg))
        if run_dir is None:  # torchrun: rank 0 names the run directory
            env = pending.result()
            run_dir = Path(broadcast_object(str(rundir.prepare_new_run(cfg)) if env.is_main else None))
        train(cfg, run_dir, pending, resume)
        process_group.finish()
        return 0
    except DataGone as err:  # met by every rank reading then: said once
        return _fail(f"{err}; {what_is_kept(run_dir)}", EXIT_USAGE)
    except NoDevice as err:  # met by this rank alone, while it joined
        return _fail(str(err), EXIT_USAGE)
    except BadImage as err:  # met by this rank alone, while reading its share
        print(f"scalesgd: error: {as_flags(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except (UsageError, DataError) as err:
        settle(pending, cfg.runtime.timeout)
        _say(rank, f"error: {err}")
        return EXIT_USAGE
    except NonFiniteLoss as err:
        _say(rank, f"error: {err}; stopped, {what_is_kept(run_dir)}")
        return EXIT_NON_FINITE
    except NoSpace as err:
        return _fail(f"{err}; free some space, then continue with `resume` {run_dir}", 1)
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if process_group.is_peer_failure(err):
            return process_group.peer_lost(err)
        cause = named_cause(err, rank, run_dir)
        if cause is None:
            raise
        return _fail(f"{cause}; {what_is_kept(run_dir)}", 1)
    finally:
        if pending is not None:
            with contextlib.suppress(Exception):  # closing must not hide how the run ended
                process_group.close()


def named_cause(err: Exception, rank: int, run_dir: Path | None) -> str | None:
    """A failure of this rank's own that one line can name (a data loader process died, the disk filled), or None:
    a restart may get past either, so the status is 1, not a bad input's."""
    died = loader_death(err)
    if died is not None:
        return f"worker rank {rank}'s {died}"
    if disk_full(err):
        written = getattr(err, "filename", None) or f"into {run_dir}"
        return f"no space left on the device writing {written}"
    return None


def _fail(line: str, code: int) -> int:
    """End on `line`: left for our launcher, which says the first such line once for the whole run (several ranks may
    meet the same cause), else said here."""
    line = as_flags(line)
    if not heartbeat.leave_note(line):
        print(f"scalesgd: error: {line}", file=sys.stderr)
    return code


def settle(pending, timeout_s: float) -> None:
    """Let the group finish joining before a rank leaves on bad input found while it joined (the data is read
    meanwhile): rank 0 holds the rendezvous store, and a peer still joining would see it vanish and say so."""
    if pending is None:
        return
    with contextlib.suppress(Exception):  # the group could not form: nothing to wait for
        pending.result(timeout=timeout_s)


def what_is_kept(run_dir: Path | None) -> str:
    """The truth about a stopped run's checkpoint, for its last line."""
    if run_dir is not None and (Path(run_dir) / CHECKPOINT_NAME).exists():
        return f"the last good checkpoint is kept in {run_dir}"
    return "no checkpoint had been written yet"


def procs_per_node(cfg: TrainConfig) -> int | None:
    """Processes per node for a hierarchical exchange: the option, else LOCAL_WORLD_SIZE."""
    if not cfg.needs_topology:
        return None
    return cfg.exchange.procs_per_node or process_group.local_world_size(cfg.runtime.workers)


def _say(rank: int, line: str) -> None:
    """Rank 0 speaks for all, in the command line's terms."""
    if rank == 0:
        print(f"scalesgd: {as_flags(line)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalesgd.train.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    return run(rundir.read_config(args.run_dir), args.run_dir, args.resume)


if __name__ == "__main__":
    launcher.join_launcher()
    process_group.exit_process(main())
