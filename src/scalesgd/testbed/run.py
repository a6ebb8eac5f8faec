"""Starting a command's workers inside the testbed's nodes, with torchrun's environment."""

from __future__ import annotations

import subprocess
import sys

from scalesgd.runtime import launcher
from scalesgd.runtime.link import TESTBED_VARIABLE
from scalesgd.testbed.netns import DEVICE, TestbedError, check_host, read_state

MASTER_PORT = 29500  # each node has its own network stack: no clash with the host's ports
PREFIX_VARIABLE = TESTBED_VARIABLE  # set in every worker: the testbed it runs on (a sweep reshapes it)


def resolve(command: list[str]) -> list[str]:
    """`scalesgd …` and `python …` run with this interpreter (the venv need not be on PATH)."""
    if not command:
        raise TestbedError("give the command to run after --, e.g. `scalesgd testbed run -- scalesgd bench link`")
    if command[0] == "scalesgd":
        return [sys.executable, "-m", "scalesgd", *command[1:]]
    if command[0] in ("python", "python3"):
        return [sys.executable, *command[1:]]
    return command


def run(prefix: str, command: list[str], timeout_s: float) -> int:
    """One process per (node, local rank); rank 0's output is streamed; the first failure's status returned."""
    check_host()
    spec = read_state(prefix)
    if spec is None:
        raise TestbedError(f"no testbed {prefix!r} is up; start one with `scalesgd testbed up --prefix {prefix}`")
    argv = resolve(command)
    workers = []
    for node in range(spec.nodes):
        for local in range(spec.procs_per_node):
            rank = node * spec.procs_per_node + local
            env = launcher.worker_env(rank, spec.world_size, spec.address(0), MASTER_PORT, local_rank=local,
                                      local_world=spec.procs_per_node, node=node, ifname=DEVICE)
            env[PREFIX_VARIABLE] = prefix
            # `ip netns exec` execs the command: the worker's parent is this launcher
            workers.append((["ip", "netns", "exec", spec.node(node), *argv], env,
                            None if rank == 0 else subprocess.DEVNULL))
    return launcher.launch(workers, timeout_s)

