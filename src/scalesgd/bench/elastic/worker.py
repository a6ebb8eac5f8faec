"""A worker of an elastic run under faults: a small model trained by DiLoCo among whoever is alive, the faults
planned for it injected at a step or inside a round's reduce (torchft's EventInjector, in a process of its own so
that the faults are real: SIGKILL, SIGSTOP), each fault's moment written to the store."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from scalesgd.comm.codecs import CodecSettings, LowrankOptions, TopkOptions
from scalesgd.elastic import ElasticMembership, heal
from scalesgd.elastic.outcomes import CoordinatorLost, StateLost
from scalesgd.periodic import DiLoCo

H = 4  # inner steps a round
# the small model's matrices factored by low rank, and a tenth of its entries sent by top-k
SETTINGS = CodecSettings(LowrankOptions(rank=2, min_rate=1.0), TopkOptions(density=0.1, density_warmup=0))
OWN = ("residual", "error", "momentum", "velocity")  # a codec's per-member state, by the names its state gives


def batches(name: str, step: int, width: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """This worker's batch at `step`: its own data, the same in every run."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{name}/{step}".encode()))
    x = torch.randn(16, 8, generator=generator)
    return x, x @ torch.arange(8.0).unsqueeze(1) + 0.1 * torch.randn(16, 1, generator=generator)


def model_of(name: str, width: int = 16) -> nn.Module:
    """Parameters of this worker's own (a run's start heals them from the first member)."""
    torch.manual_seed(zlib.crc32(name.encode()))
    return nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1))


def run(name: str, address: str, out: str, steps: int, faults: dict, codec: str = "fp32", start: int = 1,
        width: int = 16, heartbeat_s: float = 0.25) -> None:
    """Train `steps` inner steps; `faults` for this worker: {"kill": step, "stop": step, "kill_in_reduce": round,
    "stop_in_reduce": round, "await_at": (step, key), "announce": key, "late": (step, seconds), "kill_in_regroup":
    True, "kill_in_rendezvous": True, "kill_sending_heal": True, "group_timeout_s": seconds, "heal_behind": True};
    `start`: the workers the run starts with.
    Writes its rounds' log, its digest and its global parameters to `out/name.pt`, each committed round to the
    store as `progress/<name>/<round>`, and a fault's moment as `fault/<name>`."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a run that hangs says where, when asked
    os.environ["SCALESGD_FP8_KERNELS"] = "eager"  # the same bytes as compiled, without each worker's compile
    torch.set_num_threads(1)
    model = model_of(name, width)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    members = ElasticMembership.connect(address, name, config="elastic bench", heartbeat_s=heartbeat_s,
                                        start_workers=start, slow_tolerance=None,  # faults at set steps: lockstep
                                        group_timeout_s=faults.get("group_timeout_s", 60.0),
                                        heal_behind=faults.get("heal_behind", False))
    store = members.elastic.store

    def fault(kind: int) -> None:
        store.set(f"fault/{name}", repr(time.time()))
        os.kill(os.getpid(), kind)

    if faults.get("kill_in_regroup"):  # named in a quorum, dead before its group is built
        members.elastic._gathered = lambda: fault(signal.SIGKILL)
    if faults.get("kill_in_rendezvous"):  # … dead once every member came, inside the group's rendezvous
        gathered = members.elastic._gathered
        members.elastic._gathered = lambda: gathered() and fault(signal.SIGKILL)
    if faults.get("kill_sending_heal"):  # dead once a joiner has its counters, before its global state crossed
        heal._THREADS = SimpleNamespace(submit=lambda work: fault(signal.SIGKILL))
    if "announce" in faults:  # heartbeating now: the others may go on
        store.set(faults["announce"], "1")
    try:
        result = _train(name, model, inner, members, steps, faults, codec, width, fault)
    except (CoordinatorLost, StateLost) as lost:  # the ways a run stops here on purpose: said, a status of its own
        torch.save({"error": str(lost)}, Path(out) / f"{name}.pt")
        os._exit(3)
    torch.save(result, Path(out) / f"{name}.pt")
    members.elastic.close()
    os._exit(0)


def _train(name, model, inner, members, steps, faults, codec, width, fault) -> dict:
    store = members.elastic.store
    with DiLoCo(model, inner, H, codec=codec, settings=SETTINGS, group=members) as diloco:
        own_at_join = own_norm(diloco.driver.state_dict())
        _inside_rounds(diloco, faults, fault)
        while diloco.steps < steps:
            if not diloco.elastic.planned:  # its global state still crossing (heal_behind): no steps of its own
                diloco.elastic.sit_out()
                continue
            if diloco.steps == faults.get("kill"):
                fault(signal.SIGKILL)
            if diloco.steps == faults.get("stop") and not faults.get("stopped"):
                faults["stopped"] = True
                fault(signal.SIGSTOP)  # whoever planned it sends SIGCONT
            if diloco.steps == faults.get("await_at", (None,))[0]:
                store.wait([faults["await_at"][1]])  # torchft's barrier_at: a joiner is on its way
            if diloco.steps == faults.get("late", (None,))[0]:
                time.sleep(faults["late"][1])  # alive and heartbeating, its round's end this much behind
            x, y = batches(name, diloco.steps, width)
            nn.functional.mse_loss(model(x), y).backward()
            rounds = diloco.rounds
            inner.step()
            inner.zero_grad()
            if diloco.rounds != rounds:
                with contextlib.suppress(Exception):  # what it says, not what it does: a lost coordinator is
                    store.set(f"progress/{name}/{diloco.rounds}", "1")  # the next round's to report
        diloco.finish()
        return {"log": diloco.elastic.log, "digest": diloco.elastic.digest(), "steps": diloco.steps,
                "rounds": diloco.rounds, "global": [p.detach().clone() for p in diloco.global_params],
                "healed_from": diloco.elastic.healed_from, "bytes_sent": diloco.bytes_sent,
                "own_at_join": own_at_join, "own_at_end": own_norm(diloco.driver.state_dict())}


def own_norm(state) -> float:
    """The norm of a codec state's per-member tensors (residuals, error feedback): 0 where it holds none."""
    if isinstance(state, dict):
        return sum(value.norm().item() if key in OWN and isinstance(value, torch.Tensor) else own_norm(value)
                   for key, value in state.items())
    return sum(own_norm(value) for value in state) if isinstance(state, list) else 0.0


def _inside_rounds(diloco: DiLoCo, faults: dict, fault) -> None:
    """Die (or stop) on the communication thread as round `kill_in_reduce`'s (`stop_in_reduce`'s) exchange
    begins: the others are inside the reduce."""
    if "kill_in_reduce" not in faults and "stop_in_reduce" not in faults:
        return
    complete = diloco.driver.complete

    def faulty(pending):
        if diloco.rounds == faults.get("kill_in_reduce"):
            fault(signal.SIGKILL)
        if diloco.rounds == faults.get("stop_in_reduce") and not faults.get("stopped"):
            faults["stopped"] = True
            fault(signal.SIGSTOP)
        return complete(pending)

    diloco.driver.complete = faulty
