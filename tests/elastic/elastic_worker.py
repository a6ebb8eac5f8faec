"""A worker of the elastic tests: a small model trained by DiLoCo among whoever is alive, with the faults a test
plans for it injected at a step (torchft's EventInjector, in a process of its own so the faults are real)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from torch import nn

from scalesgd.elastic import ElasticMembership
from scalesgd.periodic import DiLoCo

H = 4


def batches(name: str, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This worker's batch at `step`: its own data, the same in every run."""
    generator = torch.Generator().manual_seed(hash((name, step)) % 2**31)
    x = torch.randn(16, 8, generator=generator)
    return x, x @ torch.arange(8.0).unsqueeze(1) + 0.1 * torch.randn(16, 1, generator=generator)


def run(name: str, address: str, out: str, steps: int, faults: dict, codec: str = "fp32", start: int = 1) -> None:
    """Train `steps` inner steps; `faults` for this worker: {"kill": step, "stop": step, "kill_in_reduce": round,
    "stop_in_reduce": round, "await_at": (step, key), "announce": key}.
    Writes its rounds' log, its digest and its global parameters to `out/name.pt`; each committed round to the
    store as `progress/<name>/<round>` (what the test waits on)."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    torch.manual_seed(sum(map(ord, name)))  # every worker starts from parameters of its own: the start heals them
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    members = ElasticMembership.connect(address, name, config="elastic test", heartbeat_s=0.1,
                                        start_workers=start)
    store = members.elastic.store
    if "announce" in faults:  # heartbeating now: the others may go on
        store.set(faults["announce"], "1")
    with DiLoCo(model, inner, H, codec=codec, group=members) as diloco:
        if "kill_in_reduce" in faults or "stop_in_reduce" in faults:
            _fault_inside_round(diloco, faults)
        while diloco.steps < steps:
            if diloco.steps == faults.get("kill"):
                os.kill(os.getpid(), signal.SIGKILL)
            if diloco.steps == faults.get("stop") and not faults.get("stopped"):
                faults["stopped"] = True
                os.kill(os.getpid(), signal.SIGSTOP)  # the test sends SIGCONT
            if diloco.steps == faults.get("await_at", (None,))[0]:
                store.wait([faults["await_at"][1]])  # torchft's barrier_at: a joiner is on its way
            x, y = batches(name, diloco.steps)
            nn.functional.mse_loss(model(x), y).backward()
            rounds = diloco.rounds
            inner.step()
            inner.zero_grad()
            if diloco.rounds != rounds:
                store.set(f"progress/{name}/{diloco.rounds}", "1")
        diloco.finish()
        result = {"log": diloco.elastic.log, "digest": diloco.elastic.digest(), "steps": diloco.steps,
                  "rounds": diloco.rounds, "global": [p.detach().clone() for p in diloco.global_params],
                  "healed_from": diloco.elastic.healed_from}
    torch.save(result, Path(out) / f"{name}.pt")
    members.elastic.close()
    os._exit(0)


def _fault_inside_round(diloco: DiLoCo, faults: dict) -> None:
    """Die (or stop) on the communication thread as round `kill_in_reduce`'s (`stop_in_reduce`'s) exchange
    begins: the others are inside the reduce."""
    complete = diloco.driver.complete

    def faulty(pending):
        if diloco.rounds == faults.get("kill_in_reduce"):
            os.kill(os.getpid(), signal.SIGKILL)
        if diloco.rounds == faults.get("stop_in_reduce") and not faults.get("stopped"):
            faults["stopped"] = True
            os.kill(os.getpid(), signal.SIGSTOP)  # the test sends SIGCONT
        return complete(pending)

    diloco.driver.complete = faulty
