"""The local launcher: start N workers with the environment torchrun would give them, and supervise."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

from scalesgd.errors import EXIT_NON_FINITE, EXIT_PEER_LOST, EXIT_USAGE
from scalesgd.runtime.forked import Forked, ForkedHere, module_of
from scalesgd.runtime.heartbeat import Heartbeats, beat_in_background

LAUNCHED_MARK = "SCALESGD_LAUNCHED"
LAUNCHER_PID = "SCALESGD_LAUNCHER_PID"  # the launcher: the worker ends when that process does
PR_SET_PDEATHSIG = 1
POLL_S = 0.1
KILL_GRACE_S = 5.0


def free_port(addr: str) -> int:
    """A port on `addr` that nothing listens on now."""
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def worker_env(rank: int, world: int, addr: str, port: int, local_rank: int | None = None,
               local_world: int | None = None, node: int = 0, ifname: str | None = None) -> dict:
    """The environment torchrun would give worker `rank`; gloo binds to `ifname` (loopback for 127.x)."""
    env = dict(os.environ)
    local_world = world if local_world is None else local_world
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank if local_rank is None else local_rank),
               LOCAL_WORLD_SIZE=str(local_world), GROUP_RANK=str(node), MASTER_ADDR=addr, MASTER_PORT=str(port),
               **{LAUNCHED_MARK: "1"})
    return local_settings(env, world, addr, ifname)


def local_settings(env: dict, workers: int, addr: str, ifname: str | None = None) -> dict:
    """`env` with what a local worker needs whoever launches it: gloo bound to `ifname` (loopback for 127.x), and
    cores / `workers` compute threads unless set."""
    if ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
    elif addr.startswith("127.") or addr == "localhost":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))  # as torchrun does
    return env


def spawn(args: list[str], workers: int, addr: str, port: int, timeout_s: float, restarts: int = 0,
          restart_args: Callable[[int], list[str]] | None = None) -> int:
    """Run `python ARGS` as `workers` local ranks on `addr` and supervise them; returns the exit status.

    With `restarts`, a group that failed (not on bad input, divergence or a signal to this launcher) is started
    again, up to that many times, as `python restart_args(attempt)`.
    """
    def group(argv: list[str]) -> list[tuple[list[str], dict, object]]:
        rendezvous = port or free_port(addr)
        return [([sys.executable, *argv], worker_env(r, workers, addr, rendezvous), None) for r in range(workers)]

    return launch(group(args), timeout_s, restarts, (lambda attempt: group(restart_args(attempt))) if restarts else None)


class Stopped(Exception):
    """The launcher was sent a signal that ends a run (SIGTERM from kill, systemd, Slurm, Kubernetes; SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stopped_by_signals():
    """SIGTERM and SIGHUP raise `Stopped` in the launcher, so they end the workers as Ctrl-C does."""
    def handler(signum, _frame):
        raise Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


FINAL = (0, EXIT_USAGE, EXIT_NON_FINITE)  # statuses a restart would only repeat


def launch(workers: list[tuple[list[str], dict, object]], timeout_s: float, restarts: int = 0,
           again: Callable[[int], list[tuple[list[str], dict, object]]] | None = None) -> int:
    """Start each (argv, env, stdout) worker and supervise them all; a signal, Ctrl-C or a failure to start one
    stops those already running, with one line and a non-zero status. A group that failed otherwise is started
    again as `again(attempt)` says, `restarts` times at most."""
    with stopped_by_signals():
        for attempt in range(restarts + 1):
            code, stopped_here = _launch_once(again(attempt) if attempt else workers, timeout_s)
            if stopped_here or code in FINAL:
                break
        return code


def _launch_once(workers: list[tuple[list[str], dict, object]], timeout_s: float) -> tuple[int, bool]:
    """One group's exit status, and whether this launcher was told to stop (no restart then)."""
    procs: list[subprocess.Popen | Forked] = []
    heartbeats = Heartbeats(len(workers))
    try:
        for rank, (argv, env, stdout) in enumerate(workers):
            env = env | heartbeats.env(rank) | {LAUNCHER_PID: str(os.getpid())}
            procs.append(start(argv, env, stdout))
        return supervise(procs, timeout_s, heartbeats), False
    except KeyboardInterrupt:
        stop(procs)
        print("scalesgd: interrupted; the workers were stopped", file=sys.stderr)
        return 128 + signal.SIGINT, True
    except Stopped as stopped:
        stop(procs)
        print(f"scalesgd: stopped by {stopped}; the workers were stopped", file=sys.stderr)
        return 128 + stopped.signum, True
    except OSError as err:  # fork or exec failed part-way (too many processes, no memory)
        stop(procs)
        print(f"scalesgd: error: could not start worker {len(procs)} of {len(workers)} ({err.strerror or err}); "
              "the ones started were stopped", file=sys.stderr)
        return 1, True
    finally:
        heartbeats.close()


def start(argv: list[str], env: dict, stdout, here: bool = False) -> subprocess.Popen | Forked:
    """`python -m MODULE …` forked from the server that has torch imported (`here`: from this process, which has
    imported what MODULE runs and holds no threads); any other command executed."""
    module = module_of(argv)
    if module is None:
        return subprocess.Popen(argv, env=env, stdout=stdout)
    return (ForkedHere if here else Forked)(module, argv[3:], env, stdout)


def join_launcher() -> None:
    """In a process our launcher started: end with it, and show it signs of life (no-ops anywhere else)."""
    die_with_parent()
    beat_in_background()


def die_with_parent(environ=os.environ) -> None:
    """In a worker we launched: end when its parent ends, however it ends (Linux's parent-death signal; a forked
    worker's parent, the fork server, ends with the launcher), so no orphan trains on; if the launcher is already
    gone, end now. The mark is not passed on to the worker's own children."""
    launcher_pid = environ.pop(LAUNCHER_PID, None)
    if launcher_pid is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    try:
        os.kill(int(launcher_pid), 0)
    except ProcessLookupError:
        os._exit(128 + signal.SIGTERM)


def supervise(procs: list[subprocess.Popen | Forked], timeout_s: float, heartbeats: Heartbeats | None = None) -> int:
    """Wait for every worker; after the first failure give the rest `timeout_s` to stop, then kill them.

    With `heartbeats`, a worker silent for `timeout_s` (or silent at all once another has failed) is not running:
    the run ends then, and that worker is the one named; and a failed worker that left a line saying why (its data
    loader died, the disk filled, its link went down) is the one reported, in its words, once.
    """
    failures: list[tuple[int, int]] = []  # (rank, exit code) in the order they were seen
    deadline, hung = None, []
    while True:
        for rank, p in enumerate(procs):
            if p.poll() not in (None, 0) and rank not in [r for r, _ in failures]:
                failures.append((rank, p.returncode))
        running = [r for r, p in enumerate(procs) if p.returncode is None]
        if not running:
            break
        if heartbeats is not None:
            silent = heartbeats.silent(running)
            if silent and (failures or max(age for _, age in silent) > timeout_s):
                hung = silent
                stop(procs)
                break
        if any(code == EXIT_USAGE for _, code in failures):
            stop(procs)  # bad input is the same on every rank: nobody needs to wait for the others
            break
        if failures and deadline is None:
            deadline = time.monotonic() + timeout_s
        if deadline is not None and time.monotonic() > deadline:
            stop(procs)
            break
        time.sleep(POLL_S)
    if hung:
        rank, age = hung[0]
        print(f"scalesgd: error: worker rank {rank} stopped responding (no sign of life for {age:.0f} s); "
              "the other workers were stopped", file=sys.stderr)
        return 1
    if not failures:
        return 0
    noted = first_note(failures, heartbeats)
    if noted is not None:  # a worker named the cause (its data loader died, the disk filled, its link went down)
        code, note = noted
        print(f"scalesgd: error: {note}; the other workers were stopped", file=sys.stderr)
        return shell_status(code)
    codes = [code for _, code in failures]
    if EXIT_USAGE in codes:
        return EXIT_USAGE  # rank 0 already said which input was bad
    if EXIT_NON_FINITE in codes:
        return EXIT_NON_FINITE  # rank 0 already said where the loss diverged
    rank, code = first_failure(failures)
    print(f"scalesgd: error: worker rank {rank} {describe_exit(code)}; the other workers were stopped",
          file=sys.stderr)
    return shell_status(code)


def shell_status(code: int) -> int:
    """The worker's own status; a signal's as a shell gives it."""
    return code if code > 0 else 128 - code


def first_note(failures: list[tuple[int, int]], heartbeats: Heartbeats | None) -> tuple[int, str] | None:
    """(exit status, line) of the first failed worker that left a line saying why: said once for the whole run,
    however many ranks met the cause."""
    if heartbeats is None:
        return None
    return next(((code, note) for rank, code in failures if (note := heartbeats.note(rank))), None)


def first_failure(failures: list[tuple[int, int]]) -> tuple[int, int]:
    """The earliest worker that failed on its own, rather than because a peer vanished."""
    return next(((r, c) for r, c in failures if c != EXIT_PEER_LOST), failures[0])


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code == EXIT_PEER_LOST:
        return "lost contact with its peers"
    return f"exited with status {code}"


def stop(procs: list[subprocess.Popen | Forked]) -> None:
    """Terminate the workers that are still running, killing any that ignore SIGTERM."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + KILL_GRACE_S
    for p in procs:
        try:
            p.wait(max(end - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
