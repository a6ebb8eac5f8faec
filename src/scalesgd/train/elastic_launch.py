"""The local launcher of an elastic run: host the coordinator (or join one, `--join`), start the workers, and
supervise them one by one — a worker that dies is restarted alone (`--max-restarts` times at most), rejoining at a
round boundary, while the others go on; bad input or a refused configuration stops them all; when the last round
commits, a worker of this launcher still waiting to join is ended."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections import Counter
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from scalesgd.config import TrainConfig
from scalesgd.elastic.coordinator import Address, Coordinator
from scalesgd.elastic.membership import DONE_PREFIX, FINISHED_KEY, first_line
from scalesgd.errors import EXIT_NON_FINITE, EXIT_PEER_LOST, EXIT_USAGE
from scalesgd.runtime.launcher import (
    KILL_GRACE_S,
    LAUNCHER_PID,
    POLL_S,
    Stopped,
    describe_exit,
    local_settings,
    start,
    stop,
    stopped_by_signals,
)
from scalesgd.train.elastic import ADDRESS_ENV, MEMBER_ENV

CONNECT_S = 30.0  # the longest a launch waits for the coordinator's store
ENDS_THE_RUN = (EXIT_USAGE, EXIT_NON_FINITE, EXIT_PEER_LOST)  # said by the worker; a restart would only repeat it
# (the coordinator lost: unless it answers the launcher, as after the worker's link was down)


def spawn(cfg: TrainConfig, run_dir: Path) -> int:
    """Run `cfg`'s elastic workers here: `workers` of them hosting the coordinator, or one joining `join`'s."""
    p, rt = cfg.periodic, cfg.runtime
    window = {"join_timeout_s": p.elastic_grace} if p.elastic_grace else {}  # a late member's grace, else the default
    hosted = None if p.join else Coordinator(p.min_workers, rt.master_addr, store_port=rt.master_port, **window)
    address = Address.parse(p.join) if p.join else hosted.address
    if hosted is not None:
        print(f"scalesgd: elastic run's coordinator at {address}; more workers join with `scalesgd train … --join "
              f"{address}`", file=sys.stderr, flush=True)
    names = ([f"host-w{i}" for i in range(rt.workers)] if hosted is not None
             else [f"join-{socket.gethostname()}-{os.getpid()}"])
    try:
        with hosted or nullcontext():
            try:
                store = dist.TCPStore(address.store_host, address.store_port, is_master=False,
                                      timeout=timedelta(seconds=min(rt.timeout, CONNECT_S)))
            except Exception as error:  # noqa: BLE001 - the store's own kinds: nobody listens there
                print(f"scalesgd: error: --join: no coordinator answers at {address} ({first_line(error)}); start "
                      "the run's first launch (--elastic) and give the address it printed", file=sys.stderr)
                return EXIT_USAGE
            # a joining launch holds no threads (the coordinator's are elsewhere): its one worker forked from here
            return supervise(names, run_dir, address, store, rt.max_restarts, fork_here=hosted is None)
    except Stopped as stopped:
        return 128 + stopped.signum


def supervise(names: list[str], run_dir: Path, address: Address, store: dist.TCPStore, max_restarts: int,
              fork_here: bool = False) -> int:
    """Start a worker per name and keep them going until the run's last round commits; the exit status.
    `fork_here`: each forked from this process rather than from a fork server (`runtime.forked.ForkedHere`)."""
    procs, restarts, ended, failed = {}, Counter(), set(), 0

    def launch(name: str):
        # RANK names the process (scalesgd-r<i>, as the other launches' workers); the member's rank is its quorum's
        env = local_settings({**os.environ, ADDRESS_ENV: str(address), MEMBER_ENV: name,
                              LAUNCHER_PID: str(os.getpid()), "RANK": str(names.index(name))},
                             len(names), address.store_host)
        return start([sys.executable, "-m", "scalesgd.train.elastic_worker", str(run_dir)], env, None, here=fork_here)

    with stopped_by_signals():
        try:
            procs = {name: launch(name) for name in names}
            finished = None  # when this launcher saw the run's last round committed
            while procs:
                if finished is None and _check(store, FINISHED_KEY):
                    finished = time.monotonic()
                late = finished is not None and time.monotonic() - finished > KILL_GRACE_S
                for name, proc in list(procs.items()):
                    code = proc.poll()
                    if code is None:
                        if late and not _check(store, DONE_PREFIX + name):  # still waiting to join: too late
                            proc.terminate()
                            ended.add(name)
                        continue
                    del procs[name]
                    if code == 0 or name in ended:
                        continue
                    if finished is not None:  # it took the last round, then failed (writing the records)
                        print(f"scalesgd: error: worker {name} {describe_exit(code)} after the run's last round",
                              file=sys.stderr)
                        failed = 1
                        continue
                    if code in ENDS_THE_RUN and not (code == EXIT_PEER_LOST and _answers(store)):
                        stop(list(procs.values()))
                        return code
                    if restarts[name] < max_restarts:
                        restarts[name] += 1
                        print(f"scalesgd: worker {name} {describe_exit(code)}; restarting it alone (restart "
                              f"{restarts[name]} of {max_restarts}): it rejoins at a round boundary", file=sys.stderr)
                        procs[name] = launch(name)
                    else:
                        print(f"scalesgd: worker {name} {describe_exit(code)}; the others go on without it"
                              + ("" if max_restarts else " (--max-restarts N restarts a dead worker)"),
                              file=sys.stderr)
                time.sleep(POLL_S)
        except (KeyboardInterrupt, Stopped) as interrupted:
            stop(list(procs.values()))
            print("scalesgd: interrupted; the workers were stopped", file=sys.stderr)
            if isinstance(interrupted, Stopped):
                raise
            return 130
    if finished is None:
        print("scalesgd: error: every worker ended before the run's last round; resume from the last checkpoint in "
              f"{run_dir}", file=sys.stderr)
        return 1
    return failed


def _answers(store: dist.TCPStore) -> bool:
    """Whether the coordinator answers this launcher: a worker that lost it while its own link was down (or its
    host frozen) restarts and rejoins; where the coordinator is gone, the run stops here as the worker said."""
    try:
        store.check([FINISHED_KEY])
        return True
    except Exception:  # noqa: BLE001 - the store's own kinds
        return False


def _check(store: dist.TCPStore, key: str) -> bool:
    """Whether the coordinator's store holds `key` (False where it cannot be reached: the workers say so)."""
    try:
        return store.check([key])
    except Exception:  # noqa: BLE001 - the store's own kinds; the workers name the coordinator lost
        return False
