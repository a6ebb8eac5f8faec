"""The local launcher: start N workers with the environment torchrun would give them, and supervise."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from scalesgd.errors import EXIT_NON_FINITE, EXIT_PEER_LOST, EXIT_USAGE

LAUNCHED_MARK = "SCALESGD_LAUNCHED"
POLL_S = 0.1
KILL_GRACE_S = 5.0


def free_port(addr: str) -> int:
    """A port on `addr` that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
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
    if ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
    elif addr.startswith("127.") or addr == "localhost":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))  # as torchrun does
    return env


def spawn(args: list[str], workers: int, addr: str, port: int, timeout_s: float) -> int:
    """Run `python ARGS` as `workers` local ranks on `addr` and supervise them; returns the exit status."""
    port = port or free_port(addr)
    procs = [subprocess.Popen([sys.executable, *args], env=worker_env(r, workers, addr, port))
             for r in range(workers)]
    try:
        return supervise(procs, timeout_s)
    except KeyboardInterrupt:
        stop(procs)
        print("scalesgd: interrupted; the workers were stopped", file=sys.stderr)
        return 130


def supervise(procs: list[subprocess.Popen], timeout_s: float) -> int:
    """Wait for every worker; after the first failure give the rest `timeout_s` to stop, then kill them."""
    failures: list[tuple[int, int]] = []  # (rank, exit code) in the order they were seen
    deadline = None
    while True:
        for rank, p in enumerate(procs):
            if p.poll() not in (None, 0) and rank not in [r for r, _ in failures]:
                failures.append((rank, p.returncode))
        if all(p.returncode is not None for p in procs):
            break
        if failures and deadline is None:
            deadline = time.monotonic() + timeout_s
        if deadline is not None and time.monotonic() > deadline:
            stop(procs)
            break
        time.sleep(POLL_S)
    if not failures:
        return 0
    codes = [code for _, code in failures]
    if EXIT_USAGE in codes:
        return EXIT_USAGE  # rank 0 already said which input was bad
    if EXIT_NON_FINITE in codes:
        return EXIT_NON_FINITE  # rank 0 already said where the loss diverged
    rank, code = first_failure(failures)
    print(f"scalesgd: error: worker rank {rank} {describe_exit(code)}; the other workers were stopped",
          file=sys.stderr)
    return 1


def first_failure(failures: list[tuple[int, int]]) -> tuple[int, int]:
    """The earliest worker that failed on its own, rather than because a peer vanished."""
    return next(((r, c) for r, c in failures if c != EXIT_PEER_LOST), failures[0])


def describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code == EXIT_PEER_LOST:
        return "lost contact with its peers"
    return f"exited with status {code}"


def stop(procs: list[subprocess.Popen]) -> None:
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
