"""torchft's DiLoCo and Streaming DiLoCo (`torchft.local_sgd.DiLoCo`, from the pip package) as the training loop's
exchange, configured as torchft's own `train_diloco.py` does: a `Manager` per worker over its reconfigurable gloo
group with a synchronous quorum, a lighthouse, and Nesterov SGD as the outer optimizer; the pseudo-gradient in fp32
(its quantized path needs Triton on a GPU).

Each worker is its own replica group of one process. Rank 0 runs the lighthouse; the quorum needs every worker
(`min_replicas` = the world: a fixed cluster, not one shrinking on faults), and every worker starts from the same
parameters (our loop seeds them alike), so no replica heals from another at step 0 (`init_sync=False`).

Under its own fault tolerance (`bench.elastic.torchft_replica`: a process per node under torchrun, the lighthouse apart) the
same exchange takes a `ReplicaGroup`: the quorum takes whoever is alive, and a replica behind heals from a peer."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from scalesgd.comm.engine.exchange import ExchangeSetup, GradientExchange
from scalesgd.comm.engine.optimizer import IterationStats
from scalesgd.periodic.config import PeriodicConfig
from scalesgd.periodic.fragments import split
from scalesgd.periodic.outer import outer_sgd
from scalesgd.runtime.launcher import free_port

TIMEOUT = timedelta(seconds=120)  # a slow link's round (MB at Mbit/s) must not read as a failed worker


def own_address(master: str) -> str:
    """This worker's address on the interface that reaches `master` (its node's, inside a testbed namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master, 9))  # no packet is sent: the kernel picks the route and source address
        return probe.getsockname()[0]


class _Fragment(nn.Module):
    """Parameters of the model (not copies) as the module torchft synchronises together."""

    def __init__(self, params: list[nn.Parameter]):
        super().__init__()
        self.params = nn.ParameterList(params)


@dataclass(frozen=True)
class ReplicaGroup:
    """Who this replica group is and where its lighthouse answers, as torchft's launchers tell its `Manager`: the
    fewest replicas a quorum takes, the seconds its collectives, healing and quorum may take."""

    replica_id: str
    lighthouse: str  # http://host:port
    min_replicas: int
    collective_timeout: timedelta = TIMEOUT
    heal_timeout: timedelta = TIMEOUT
    quorum_timeout: timedelta = TIMEOUT


def in_launch(world: int, rank: int, master: str) -> tuple[ReplicaGroup, object]:
    """Our launch's workers as torchft's replica groups of one: rank 0 runs the lighthouse (returned, to shut
    down), whose quorum needs all of them."""
    from torchft._torchft import LighthouseServer  # the optional extra, imported where a run asks for it

    lighthouse = None
    where = [free_port(master) if rank == 0 else None]
    if rank == 0:
        lighthouse = LighthouseServer(bind=f"[::]:{where[0]}", min_replicas=world)
    dist.broadcast_object_list(where, src=0)
    return ReplicaGroup(f"scalesgd_{rank}", f"http://{master}:{where[0]}", world), lighthouse


def addressed_transport(host: str, timeout: timedelta):
    """torchft's HTTP checkpoint transport (a replica heals from a peer's), advertised at this replica's address:
    torchft advertises the host's name, which a testbed node (every node the same host) cannot resolve."""
    from torchft.checkpointing.http_transport import HTTPTransport  # the optional extra

    class Addressed(HTTPTransport):
        def address(self) -> str:
            return super().address().replace(f"//{socket.gethostname()}:", f"//{host}:", 1)

    return Addressed(timeout=timeout, num_chunks=0)


def buckets(bucket_mb: float) -> dict:
    """torchft's DiLoCo arguments for `--peer-bucket-mb`: its buckets of that size, or (0) its default, a tensor
    each."""
    return {"use_bucketization": True, "bucket_cap_mb": bucket_mb} if bucket_mb else {}


class TorchftExchange(GradientExchange):
    """torchft's `DiLoCo` hooked on this worker's inner optimizer: every H/F steps a fragment's fp32 pseudo-gradient is
    averaged over the quorum's gloo group and its outer SGD steps it; evaluation reads the last global parameters."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, setup: ExchangeSetup,
                 periodic: PeriodicConfig, group: ReplicaGroup | None = None):
        os.environ.setdefault("RUST_LOG", "warn")  # its quorum's INFO lines would drown the run's own output
        from torchft import Manager, ProcessGroupGloo  # the optional extra, imported where a run asks for it
        from torchft.local_sgd import DiLoCo as TorchftDiLoCo  # (the same)

        master = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self._lighthouse = None
        if group is None:
            group, self._lighthouse = in_launch(dist.get_world_size(), dist.get_rank(), master)
        else:
            master = group.lighthouse.rsplit("/", 1)[-1].rsplit(":", 1)[0]
        host = own_address(master)
        port = free_port(host)
        self._store = dist.TCPStore(host, port, 1, is_master=True, wait_for_workers=False)
        schedule = periodic.schedule
        fragments = [_Fragment(p) for p in split(model, schedule.fragments)]
        self._sizes = [sum(p.numel() * p.element_size() for p in f.parameters()) for f in fragments]
        outer = [outer_sgd(list(f.parameters()), periodic.outer_lr, periodic.outer_momentum) for f in fragments]
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=group.collective_timeout), load_state_dict=self._load_replica,
            state_dict=self._replica, min_replica_size=group.min_replicas, use_async_quorum=False,
            timeout=group.heal_timeout, quorum_timeout=group.quorum_timeout, rank=0, world_size=1,
            store_addr=host, store_port=port, lighthouse_addr=group.lighthouse, replica_id=group.replica_id,
            hostname=host, init_sync=False,
            checkpoint_transport=addressed_transport(host, group.heal_timeout))
        self.diloco = TorchftDiLoCo(self.manager, fragments, optimizer, outer, sync_every=schedule.local_steps,
                                    backup_device=torch.device("cpu"), pin_memory=False, should_quantize=False,
                                    fragment_sync_delay=schedule.overlap_steps,
                                    fragment_update_alpha=periodic.mix, **buckets(periodic.peer_bucket_mb))
        self.diloco.__enter__()
        self._bytes, self._landed = 0, 0.0
        super().__init__(model, optimizer, None, bare=model, precision=setup.precision, clip_norm=setup.clip_norm)

    def _replica(self) -> dict:
        return {"model": self.model.state_dict(), "inner": self.optimizer.state_dict()}

    def _load_replica(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["inner"])

    def no_sync(self) -> AbstractContextManager:
        return nullcontext()

    def step(self) -> bool:
        """The inner step; torchft's hook on it synchronises a fragment where its round ends (the bytes counted are
        its fp32 pseudo-gradient's, as each rank hands it to the allreduce)."""
        start, before = time.perf_counter(), self.manager.current_step()
        stepped = super().step()
        if self.manager.current_step() != before:
            self._bytes += self._sizes[before % len(self._sizes)]
            self._landed += time.perf_counter() - start
        return stepped

    @contextmanager
    def evaluated(self):
        """The global parameters (torchft's backup of the last synchronised ones) in place of the local ones."""
        params = [(p, f.original_parameters[name]) for f in self.diloco._fragments
                  for name, p in f._model_fragment.named_parameters()]
        local = [p.detach().clone() for p, _ in params]
        with torch.no_grad():
            for p, global_copy in params:
                p.copy_(global_copy)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                for (p, _), mine in zip(params, local):
                    p.copy_(mine)

    def settle(self) -> None:
        self.diloco._wait()

    def digest(self) -> str:
        """A hash of the global parameters and the outer optimizers' momenta: equal on every replica of a quorum."""
        hasher = hashlib.sha256()
        for f in self.diloco._fragments:
            state = f._outer_optimizer.state_dict()["state"]
            momenta = [state[i]["momentum_buffer"] for i in sorted(state) if "momentum_buffer" in state[i]]
            for tensor in [*f.original_parameters.values(), *momenta]:
                hasher.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return hasher.hexdigest()[:16]

    def stats(self) -> IterationStats:
        sent, self._bytes = self._bytes, 0
        exposed, self._landed = self._landed, 0.0
        return IterationStats(exposed_s=exposed, bytes_sent=sent)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "codec": None, "scaler": self.scaler.state_dict()}

    def close(self) -> None:
        self.diloco.__exit__(None, None, None)
        self.manager.shutdown(wait=False)
        if self._lighthouse is not None:
            self._lighthouse.shutdown()
