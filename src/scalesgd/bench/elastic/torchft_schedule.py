"""torchft's DiLoCo with its own fault tolerance under the failure schedule: `torchft_lighthouse` on node 0 (a
quorum of at least one, as torchft's README starts it), and on every node a replica group of one process under
`torchrun --max-restarts` (`bench.elastic.torchft_replica`), as torchft's examples launch them."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

from scalesgd.bench.elastic.injector import Injector, Schedule
from scalesgd.bench.elastic.launches import finish, node_env
from scalesgd.errors import UsageError
from scalesgd.train import metrics
from scalesgd.train.rundir import METRICS_NAME

LIGHTHOUSE_PORT = 29510
TORCHRUN_PORT = 29600  # each node's own torchrun, on its loopback (a testbed node has no name to resolve)
# torchft's README: `torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000`; the join
# window is its binary's default instead (60 s, as our coordinator's): a writer evaluating for 20 s must not be left
# out of the quorum, as a 10 s window leaves it at 10 Mbit/s
LIGHTHOUSE_ARGS = ("--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "60000")
PEER_ARGS = ("--peer", "torchft", "--codec", "fp32")  # its pseudo-gradient in fp32 (its quantized path needs Triton)


def lighthouse_binary() -> str:
    """torchft's lighthouse, installed beside this interpreter by the peers extra."""
    found = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent)) or \
        shutil.which("torchft_lighthouse")
    if found is None:
        raise UsageError("mode torchft needs torchft's lighthouse: pip install 'scalesgd[peers]'")
    return found


def run_torchft(spec, train: list[str], run_dir: Path, schedule: Schedule | None, local_steps: int,
                max_restarts: int, limit_s: float) -> dict:
    """The lighthouse on node 0, a replica group on every node; what they logged."""
    deadline = time.monotonic() + limit_s
    lighthouse = subprocess.Popen(["ip", "netns", "exec", spec.node(0), lighthouse_binary(), *LIGHTHOUSE_ARGS,
                                   "--bind", f"[::]:{LIGHTHOUSE_PORT}"], env=node_env(spec, 0),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dirs = [run_dir / f"node{i}" for i in range(spec.nodes)]
    address = f"http://{spec.address(0)}:{LIGHTHOUSE_PORT}"
    launches = [subprocess.Popen(
        ["ip", "netns", "exec", spec.node(i), sys.executable, "-m", "torch.distributed.run", "--master-addr",
         "127.0.0.1", "--master-port", str(TORCHRUN_PORT), "--nnodes", "1", "--nproc-per-node", "1",
         "--max-restarts", str(max_restarts), "--module",
         "scalesgd.bench.elastic.torchft_replica", "--replica", str(i), "--replicas", str(spec.nodes), "--lighthouse",
         address, "--run-dir", str(dirs[i]), "--", *train, *PEER_ARGS],
        env=node_env(spec, i), stdout=subprocess.DEVNULL) for i in range(spec.nodes)]
    try:
        with (Injector(spec, schedule, lambda: all(p.poll() is None for p in launches)) if schedule
              else contextlib.nullcontext()):
            codes = [finish(p, deadline) for p in launches]
    finally:
        lighthouse.terminate()
        lighthouse.wait(30)
    logs = [metrics.read(d / METRICS_NAME) if (d / METRICS_NAME).exists() else [] for d in dirs]
    kills = sum(1 for fault in (schedule.log if schedule else []) if fault["fault"] == "kill")
    figures = goodput(logs, kills, local_steps)
    committed = [r for r in logs[0] if r["kind"] == "round" and r["committed"]]  # node 0's: never faulted
    return {"code": max(codes, key=abs), "dirs": dirs, "boundaries": [r["at"] for r in committed],
            "members": [[r["at"], r["members"]] for r in committed], "rounds": len(committed),
            "restarts": sum(max(0, sum(r["kind"] == "start" for r in log) - 1) for log in logs), **figures}


def goodput(logs: list[list[dict]], kills: int, local_steps: int) -> dict:
    """Inner steps that reached the global model (a replica's round committed with its own work, not a peer's
    state it healed to) ÷ inner steps computed (every round each replica logged, and for each kill the round its
    worker died in, counted whole: a lower bound, as the elastic runs' is)."""
    rounds = [r for log in logs for r in log if r["kind"] == "round"]
    committed = sum(r["steps"] for r in rounds if r["committed"] and not r["healed"])
    computed = sum(r["steps"] for r in rounds) + kills * local_steps
    return {"goodput": committed / computed if computed else None, "committed_steps": committed,
            "computed_steps": computed, "discarded_rounds": sum(not r["committed"] for r in rounds)}
