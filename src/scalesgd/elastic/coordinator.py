"""The service an elastic run's members find each other through: torchft's lighthouse (heartbeats in, a quorum of
the live members out) and a torch.distributed `TCPStore` (each quorum's group rendezvous, each round's commit
decision). Both live in one process, the run's single point of failure: the local launcher's, or one started on a
host of its own (`python -m scalesgd.elastic`). Where it dies, the members stop at their next round
boundary with the last checkpoint to resume from."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

HEARTBEAT_S = 0.5  # how often a member says it is alive
# how long a quorum waits for a live member (heartbeating) that has not asked yet: one still sending its part of the
# last round on a slow link, or evaluating, is waited for rather than left out and healed again (a dead or frozen one
# stops heartbeating and is not waited for)
JOIN_TIMEOUT_S = 60.0
TIMEOUT_KEY = "scalesgd/heartbeat_timeout_s"  # in the store: the members' grace window is the lighthouse's timeout
PEERS_EXTRA = "pip install 'scalesgd[peers]' (torchft's lighthouse decides elastic rounds' members)"


def lighthouse_module():
    """torchft's compiled lighthouse (ImportError naming the extra that brings it)."""
    os.environ.setdefault("RUST_LOG", "warn")  # its quorum log is a line a request otherwise
    try:
        from torchft import _torchft  # optional: the peers extra
    except ImportError as error:
        raise ImportError(f"elastic rounds need torchft: {PEERS_EXTRA}") from error
    return _torchft


@dataclass(frozen=True)
class Address:
    """Where the members reach the coordinator: its lighthouse's URL and its store's host and port."""

    lighthouse: str
    store_host: str
    store_port: int

    def __str__(self) -> str:
        return f"{self.lighthouse},{self.store_host}:{self.store_port}"

    @classmethod
    def parse(cls, text: str) -> Address:
        """`http://HOST:PORT,HOST:PORT` (the lighthouse, then the store) (ValueError naming the value)."""
        lighthouse, _, store = text.partition(",")
        host, _, port = store.rpartition(":")
        if not lighthouse.startswith("http://") or not host or not port.isdigit():
            raise ValueError(f"coordinator address {text!r}: give http://HOST:PORT,HOST:PORT (the lighthouse's, "
                             "then the store's), as the coordinator prints it")
        return cls(lighthouse, host, int(port))


class Coordinator:
    """A lighthouse that issues a quorum once `min_workers` members ask (and more than half of those heartbeating),
    waiting `join_timeout_s` for live stragglers, and counts a member dead after `heartbeat_timeout_s` without a
    heartbeat; and the store, on `host` (ports chosen free unless given)."""

    def __init__(self, min_workers: int, host: str = "127.0.0.1", heartbeat_timeout_s: float = 3 * HEARTBEAT_S,
                 join_timeout_s: float = JOIN_TIMEOUT_S, lighthouse_port: int = 0, store_port: int = 0):
        if isinstance(min_workers, bool) or not isinstance(min_workers, int) or min_workers < 1:
            raise ValueError(f"min_workers {min_workers!r}: give a whole number of workers, at least 1")
        for name, value in (("heartbeat_timeout_s", heartbeat_timeout_s), ("join_timeout_s", join_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} {value!r}: give seconds above 0")
        self.lighthouse = lighthouse_module().LighthouseServer(
            bind=f"{host}:{lighthouse_port}", min_replicas=min_workers, join_timeout_ms=int(join_timeout_s * 1000),
            heartbeat_timeout_ms=int(heartbeat_timeout_s * 1000))
        port = int(self.lighthouse.address().rsplit(":", 1)[1])
        self.store = dist.TCPStore(host, store_port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=60), use_libuv=True)
        self.store.set(TIMEOUT_KEY, str(heartbeat_timeout_s))
        self.address = Address(f"http://{host}:{port}", host, self.store.port)

    def close(self) -> None:
        self.lighthouse.shutdown()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    """Run a coordinator on this host until interrupted (for members on other hosts)."""
    parser = argparse.ArgumentParser(prog="python -m scalesgd.elastic", description=main.__doc__)
    parser.add_argument("--min-workers", type=int, required=True)
    parser.add_argument("--host", help="the address members reach it at (default: this host name's)")
    parser.add_argument("--port", type=int, default=29510,
                        help="the lighthouse's; the store's is the next one (0: both chosen free)")
    parser.add_argument("--heartbeat-timeout", type=float, default=3 * HEARTBEAT_S, metavar="S",
                        help="seconds without a heartbeat before a member is dropped; on a link a round's exchange "
                             "fills, heartbeats queue behind it: give it more (default %(default)g)")
    parser.add_argument("--join-timeout", type=float, default=JOIN_TIMEOUT_S, metavar="S",
                        help="seconds a quorum waits for a live member that has not asked to join it yet: the "
                             "grace window of a round's late member (`scalesgd train --elastic-grace`; default "
                             "%(default)g)")
    args = parser.parse_args(argv)
    for flag, value in (("--heartbeat-timeout", args.heartbeat_timeout), ("--join-timeout", args.join_timeout)):
        if not value > 0:
            parser.exit(2, f"{parser.prog}: error: {flag} {value:g}: give seconds above 0\n")
    if args.host is None:  # looked up only when not given: a host whose name does not resolve can still serve
        try:
            args.host = socket.gethostbyname(socket.gethostname())
        except OSError:
            parser.exit(2, f"{parser.prog}: error: this host's name {socket.gethostname()!r} does not resolve; "
                           "give --host ADDRESS\n")
    with Coordinator(args.min_workers, args.host, heartbeat_timeout_s=args.heartbeat_timeout,
                     join_timeout_s=args.join_timeout, lighthouse_port=args.port,
                     store_port=args.port + 1 if args.port else 0) as served:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        print(served.address, flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
