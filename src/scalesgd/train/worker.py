"""One worker process: join the group, train, and turn failures into one line and an exit status."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scalesgd.config import TrainConfig
from scalesgd.errors import EXIT_NON_FINITE, EXIT_PEER_LOST, EXIT_USAGE, NonFiniteLoss, UsageError
from scalesgd.train import distributed


def run(cfg: TrainConfig, run_dir: Path | None, resume: bool) -> int:
    """Train on this rank; `run_dir` None means rank 0 chooses it (torchrun, where ranks may disagree)."""
    from scalesgd.data import DataError
    from scalesgd.launcher import LAUNCHED_MARK
    from scalesgd.train.launch import prepare_new_run
    from scalesgd.train.loop import train

    rank = int(os.environ.get("RANK", 0))
    under_our_launcher = os.environ.get(LAUNCHED_MARK) == "1"
    pending = None
    try:
        pending = distributed.start_init(cfg.timeout, cfg.threads, exchange_group=cfg.own_exchange_group,
                                         procs_per_node=procs_per_node(cfg))
        if run_dir is None:  # torchrun: rank 0 names the run directory
            env = pending.result()
            run_dir = Path(distributed.broadcast_object(str(prepare_new_run(cfg)) if env.is_main else None))
        train(cfg, run_dir, pending, resume)
        distributed.finish()
        return 0
    except (UsageError, DataError) as err:
        _say(rank, f"error: {err}")
        return EXIT_USAGE
    except NonFiniteLoss as err:
        _say(rank, f"error: {err}; stopped, the last good checkpoint is kept in {run_dir}")
        return EXIT_NON_FINITE
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if not distributed.is_peer_failure(err):
            raise
        if not under_our_launcher:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(f"scalesgd: rank {rank}: a collective failed, a peer died or timed out: {first}",
                  file=sys.stderr)
        return EXIT_PEER_LOST
    finally:
        if pending is not None:
            try:
                distributed.close()
            except Exception:
                pass


def procs_per_node(cfg: TrainConfig) -> int | None:
    """Processes per node for a hierarchical exchange: the option, else LOCAL_WORLD_SIZE."""
    if not cfg.needs_topology:
        return None
    return cfg.procs_per_node or distributed.local_world_size(cfg.workers)


def _say(rank: int, line: str) -> None:
    if rank == 0:
        print(f"scalesgd: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from scalesgd.train.launch import read_config

    parser = argparse.ArgumentParser(prog="python -m scalesgd.train.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    return run(read_config(args.run_dir), args.run_dir, args.resume)


if __name__ == "__main__":
    distributed.exit_process(main())
