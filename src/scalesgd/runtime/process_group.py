"""Joining the process group: from our own launcher or from torchrun, on any backend."""

from __future__ import annotations

import datetime
import gc
import os
import socket
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from scalesgd import checks
from scalesgd.comm.wire.groups import own_group
from scalesgd.comm.wire.membership import Membership
from scalesgd.comm.wire.topology import Topology, build_groups
from scalesgd.errors import EXIT_PEER_LOST, NoDevice, PeerLost, UsageError
from scalesgd.runtime import heartbeat
from scalesgd.runtime.launcher import LAUNCHED_MARK

# What a collective says when another worker died or stopped answering (lower case), and where it comes from
PEER_FAILURE_PATTERNS = (
    "connection reset",  # gloo: "Read error …: Connection reset by peer" (the peer's process died)
    "connection closed",  # gloo: "Connection closed by peer"
    "connection refused",  # the rendezvous store: nobody listens any more
    "broken pipe",  # writing to a peer that is gone
    "timed out",  # gloo: "Timed out waiting 5000ms for recv operation to complete"
    "pair closure",  # gloo: "Application timeout caused pair closure"
    "collective operation timeout",  # NCCL's watchdog
    "communicator was aborted",  # NCCL, after a peer failed
)


_LISTENERS: list[socket.socket] = []  # rendezvous sockets handed to a store (rank 0)


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits, and who is in the run with it (`members`: its groups, its collectives)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    members: Membership = Membership()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def exchange_group(self):
        """The gradient exchange's own group (never shared with the loop's collectives); None where none was made."""
        return self.members.exchange_group

    @property
    def topology_groups(self):
        """The node and cross-node groups (hierarchical exchange, hybrid sharding); None where none were made."""
        return self.members.topology_groups


def launched_by_torchrun(environ=os.environ) -> bool:
    """True when a launcher (torchrun or ours) already set RANK, WORLD_SIZE and MASTER_ADDR."""
    return checks.launched(environ)


def start_init(timeout_s: float, threads: int = 0, exchange_group: bool = False,
               procs_per_node: int | None = None) -> Future:
    """Join the process group on a background thread, so model and data are built meanwhile (Honda et al.'s early communicator init)."""
    set_threads(threads)  # here: torch's thread count is per calling thread
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scalesgd-init")
    future = pool.submit(init, timeout_s, threads, exchange_group, procs_per_node)
    pool.shutdown(wait=False)
    return future


def init(timeout_s: float, threads: int = 0, exchange_group: bool = False,
         procs_per_node: int | None = None) -> DistEnv:
    """Create the default process group from the environment (env://): gloo, and NCCL for CUDA tensors.

    Also create, eagerly and warmed: with `exchange_group`, the gradient exchange's own group; with
    `procs_per_node`, the node and cross-node groups of the hierarchical exchange.
    """
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device = device_of(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    set_threads(threads)
    timeout = datetime.timedelta(seconds=timeout_s)
    if os.environ.get(LAUNCHED_MARK) == "1":  # ours: the store listens on the rendezvous address alone
        dist.init_process_group(backend_for(device), store=rendezvous_store(rank, world, timeout), rank=rank,
                                world_size=world, timeout=timeout)
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent hosts the store
        dist.init_process_group(backend_for(device), store=attempt_store(world, timeout), rank=rank,
                                world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend_for(device), rank=rank, world_size=world, timeout=timeout)
    groups = {}
    if exchange_group:
        groups["exchange_group"] = own_group()  # the default group's backends and timeout
    if procs_per_node:
        groups["topology_groups"] = build_groups(Topology(world, rank, procs_per_node))
    env = DistEnv(rank, world, local_rank, local_world, device, Membership.world(**groups))
    warm_up(env)
    return env


def device_of(local_rank: int) -> torch.device:
    """This worker's device: the GPU of its local rank where PyTorch sees GPUs, else the CPU. A host that starts more
    workers than it has GPUs (torchrun's --nproc-per-node) is refused in one line, not by CUDA's invalid ordinal."""
    gpus = checks.gpus_here()
    if not gpus:
        return torch.device("cpu")
    if local_rank >= gpus:
        raise NoDevice(f"worker rank {os.environ.get('RANK', local_rank)} is local rank {local_rank} and PyTorch "
                       f"sees {gpus} GPU(s) on its host: start at most {gpus} workers a host (each trains on a GPU "
                       "of its own), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU")
    return torch.device("cuda", local_rank)


def rendezvous_store(rank: int, world: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """The rendezvous store at MASTER_ADDR:MASTER_PORT, its server (rank 0's) listening on that address only.

    torch's own store listens on every interface, where anyone who reaches the machine could write into the
    run (and what passes through it is unpickled); the socket bound here is handed to the store instead.
    """
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank != 0:
        return dist.TCPStore(addr, port, world, is_master=False, timeout=timeout)
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        listener = socket.create_server((addr, port), family=family, backlog=max(128, 2 * world))
    except OSError as err:  # taken since the launcher checked it
        raise UsageError(f"`master_port` {port}: {addr}:{port} cannot be listened on ({err.strerror or err}); "
                         "choose another port, or 0 for a free one") from None
    store = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout, master_listen_fd=listener.fileno())
    _LISTENERS.append(listener)  # the store serves on this descriptor: keep it open while the process lives
    return store


def attempt_store(world: int, timeout: datetime.timedelta) -> dist.Store:
    """torchrun's agent store, seen under a prefix of this attempt (TORCHELASTIC_RESTART_COUNT): after a restart,
    what the failed group wrote there (its workers' gloo addresses) cannot be read as the new group's."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"scalesgd/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def backend_for(device: torch.device) -> str:
    """gloo alone on CPU; with a GPU, NCCL for CUDA tensors and gloo for the CPU ones (the loop's
    statistics, evaluation sums, the codecs' small host-side flags), so every collective runs on any device."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def local_world_size(default: int) -> int:
    """Processes on this node, as the launcher (ours or torchrun) says; `default` without one."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", default))


def set_threads(threads: int = 0) -> None:
    """Compute threads of the calling thread: `threads`, else OMP_NUM_THREADS as the launcher set it
    (it knows how many workers share this machine: on the testbed, all nodes do), else the cores
    shared among this node's workers."""
    if not threads and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = int(os.environ["OMP_NUM_THREADS"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // local_world))


def warm_up(env: DistEnv) -> None:
    """One small collective in every group at start-up, so connections exist before iteration 1."""
    groups = [None] + [g for g in (env.exchange_group,) if g is not None]  # None: the default group
    if env.topology_groups is not None:
        groups += [env.topology_groups.node_group, env.topology_groups.cross_group]
    for device in dict.fromkeys([env.device, torch.device("cpu")]):  # each backend of a mixed group
        probe = torch.zeros(1, device=device)
        for group in groups:
            dist.all_reduce(probe, group=group)


def is_peer_failure(exc: BaseException) -> bool:
    """Whether an exception means another worker died or stopped answering (not an error of this rank's own)."""
    if isinstance(exc, (PeerLost, dist.DistNetworkError, dist.DistStoreError)):
        return True
    return isinstance(exc, RuntimeError) and any(p in str(exc).lower() for p in PEER_FAILURE_PATTERNS)


def peer_lost(err: BaseException) -> int:
    """A worker's exit when a peer died or stopped answering: quiet under our launcher (it names the rank that
    failed), one line under torchrun. A worker whose own link is down is the one cut off, and says so."""
    rank = os.environ.get("RANK", "0")
    link = link_down()
    if link is not None:
        line = f"worker rank {rank} is unreachable: its network link {link} is down"
        if not heartbeat.leave_note(line):
            print(f"scalesgd: error: {line}", file=sys.stderr)
    elif os.environ.get(LAUNCHED_MARK) != "1":
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"scalesgd: rank {rank}: a collective failed, a peer died or timed out: {first}", file=sys.stderr)
    return EXIT_PEER_LOST


def link_down(environ=os.environ, interfaces: Path = Path("/sys/class/net")) -> str | None:
    """The interface gloo binds to (GLOO_SOCKET_IFNAME) where it is down or has lost its carrier, else None: with
    two ranks both time out alike, and only the link's state tells which one was cut off."""
    name = environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    if not name:
        return None
    try:
        state = (interfaces / name / "operstate").read_text().strip()
    except OSError:
        return None
    return name if state in ("down", "lowerlayerdown") else None


def sync_buffers(module: torch.nn.Module, members: Membership, src: int = 0) -> None:
    """Give every member member `src`'s buffers (BN running statistics are per worker in training)."""
    for buf in module.buffers():
        members.broadcast(buf, src)


def finish() -> None:
    """After a successful run: wait for every rank, so none tears its connections down under a peer."""
    if dist.is_initialized():
        dist.barrier()
    close()


def exit_process(code: int):
    """End a process without interpreter finalization, after flushing its output.

    Gloo's C++ threads can still hold work objects with tensors when Python tears down; releasing
    them then needs the GIL of a dying interpreter and aborts the process (SIGABRT at exit).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def close() -> None:
    """Destroy the default group. A DDP wrapper still alive then holds the group's last reference, and freeing it
    later joins gloo's threads holding the GIL, which one of them may wait for: a hang (PyTorch issue #56297).
    Callers let their wrappers go first; cycles among them are collected here."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
