"""One elastic member as a process: train, and turn how it ended into one line and an exit status its launcher
acts on (bad input and a refused configuration: 2, the whole run stops; the coordinator lost: 3, nothing to
restart; anything else: the launcher may restart this worker alone)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scalesgd.data import DataError
from scalesgd.elastic.membership import CoordinatorLost, DivergedError, RefusedError
from scalesgd.errors import (
    EXIT_NON_FINITE,
    EXIT_PEER_LOST,
    EXIT_USAGE,
    NonFiniteLoss,
    UsageError,
    as_flags,
)
from scalesgd.runtime import launcher, process_group
from scalesgd.train import rundir
from scalesgd.train.elastic import ADDRESS_ENV, MEMBER_ENV, train_member

EXIT_COORDINATOR_LOST = EXIT_PEER_LOST


def run(run_dir: Path) -> int:
    name = os.environ.get(MEMBER_ENV, "w")
    try:
        train_member(rundir.read_config(run_dir), run_dir, os.environ[ADDRESS_ENV], name)
        return 0
    except (UsageError, DataError, RefusedError) as err:
        return _say(name, f"error: {err}", EXIT_USAGE)
    except CoordinatorLost as err:
        return _say(name, f"error: {err}", EXIT_COORDINATOR_LOST)
    except NonFiniteLoss as err:
        return _say(name, f"error: {err}; stopped, resume from the last checkpoint in {run_dir}", EXIT_NON_FINITE)
    except DivergedError as err:
        return _say(name, f"error: {err}", 1)


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
