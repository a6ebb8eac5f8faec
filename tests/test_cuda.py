"""The CUDA path: every codec on our engine and as a DDP hook, the profiler's clock and a short training run, on GPUs
with NCCL beside gloo (one rank per GPU, at most two). Skipped where there is no GPU."""

import json
import statistics
import subprocess
import sys

import pytest
import torch

from scalesgd.comm.codecs import CODECS, CodecSettings, TopkOptions
from scalesgd.comm.cost.profile import time_layers
from scalesgd.comm.engine.exchange import ENGINES, SHARDED, ExchangeSetup, build_exchange
from scalesgd.models import MODELS, build_model
from tests.spawn_util import CUDA_BACKEND, run_workers

pytestmark = pytest.mark.cuda


def gpus() -> int:
    return max(1, min(2, torch.cuda.device_count()))


def mean_gradient(rank: int, world: int, engine: str, codec: str) -> torch.Tensor:
    """One step of resnet8 on this rank's GPU through `engine` with `codec`; the averaged gradient, flat on the CPU."""
    torch.manual_seed(0)
    device = torch.device("cuda", rank)
    model = build_model("resnet8", 10, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay, the gradient is the result
    exchange = build_exchange(engine, model, optimizer, ExchangeSetup(codec, CodecSettings(TopkOptions(density=0.5))))
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 3, 16, 16, generator=g).to(device), torch.randint(0, 10, (8,), generator=g).to(device)
    torch.nn.functional.cross_entropy(exchange.model(x), y).backward()
    exchange.optimizer.step()
    grads = [p.grad for p in model.parameters()]
    assert all(grad.device == device for grad in grads)
    flat = torch.cat([grad.flatten() for grad in grads]).cpu()
    exchange.close()
    return flat


def every_codec(rank, world):
    return {(engine, name): mean_gradient(rank, world, engine, name)
            for name, entry in CODECS.items() for engine in ("scalesgd", "ddp") if entry.runs_on(engine)}


def test_every_codec_runs_on_the_engine_and_as_a_ddp_hook():
    ranks = run_workers(every_codec, gpus(), backend=CUDA_BACKEND)
    reference = ranks[0][("ddp", "fp32")]
    for case, grad in ranks[0].items():
        engine, name = case
        assert torch.isfinite(grad).all(), case
        assert all(torch.equal(grad, other[case]) for other in ranks[1:]), case  # every rank has the same mean
        if CODECS[name].wire_bytes is not None:  # a dense wire: the mean within its rounding of fp32's
            cosine = torch.nn.functional.cosine_similarity(grad, reference, dim=0).item()
            assert cosine > 0.99, (case, cosine)


def test_the_profiler_times_gpu_work_not_the_host_queueing_it():
    """The profiler's backward is the device's own time: what CUDA events around a synchronised backward measure
    (the host returns from queueing the kernels long before they are done)."""
    model = build_model("resnet8", 10, 3).cuda()
    batch = (torch.randn(256, 3, 32, 32, device="cuda"), torch.randint(0, 10, (256,), device="cuda"))
    forward, backward = time_layers(model, batch, torch.nn.functional.cross_entropy, iterations=5, warmup=2)
    assert forward > 0 and all(t >= 0 for t in backward)
    start, end, measured = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), []
    for _ in range(5):
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
        torch.cuda.synchronize()
        start.record()
        loss.backward()
        end.record()
        end.synchronize()
        measured.append(start.elapsed_time(end) / 1e3)
    assert 0.5 < sum(backward) / statistics.median(measured) < 2, (sum(backward), measured)


@pytest.mark.parametrize("exchange", [["--engine", "scalesgd", "--codec", "fp8"], ["--engine", "ddp"],
                                      ["--local-steps", "4", "--codec", "fp8"]],
                         ids=["scalesgd-fp8", "ddp", "periodic"])
def test_a_short_training_run_learns(tmp_path, exchange):
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "scalesgd", "train", "--workers", str(gpus()), "--epochs", "3",
                           "--warmup", "none", *exchange, "--run-dir", str(run), "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_test_acc"] > 0.5  # 0.61 and 0.60 on the CPU (1 epoch: 0.33, the 2026-11-26 H200 run)


def periodic_on_gpu(rank: int, world: int, codec: str, kind: str = "cuda") -> tuple[torch.Tensor, float, float]:
    """A GPT on this rank's GPU under periodic synchronisation through `codec`: its global parameters, flat on the
    CPU, and the loss before and after."""
    from scalesgd.periodic import DiLoCo

    torch.manual_seed(0)
    device = torch.device(kind, rank) if kind == "cuda" else torch.device(kind)
    model = build_model("gpt", 64, 0).to(device)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 64, (16, 65), generator=g).to(device)  # one batch, every rank's, learned by heart

    def loss() -> torch.Tensor:
        logits = model(x[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))

    first = loss().item()
    with DiLoCo(model, inner, 4, codec=codec, fragments=2, delay=1) as diloco:
        for _ in range(24):
            loss().backward()
            inner.step()
            inner.zero_grad()
        diloco.finish()
    assert all(p.device == device for p in diloco.global_params)
    return torch.cat([p.flatten() for p in diloco.global_params]).cpu(), first, loss().item()


@pytest.mark.parametrize("codec", ["fp8", "topk"])
def test_periodic_synchronisation_runs_on_the_gpu_and_learns(codec):
    ranks = run_workers(periodic_on_gpu, gpus(), codec, backend=CUDA_BACKEND)
    for params, first, last in ranks:
        assert torch.equal(params, ranks[0][0])  # every rank ends on the same global parameters
        assert last < 0.8 * first, (first, last)  # fp8 4.20 → 2.97, topk → 3.36 on two CPU ranks


def sharded_and_not(rank, world):
    """One SGD step of resnet8 on this rank's GPU, whole (DDP) and sharded (FSDP2 on NCCL, fp32, bf16 and fp8 wires,
    top-k on each unit's whole gradients; and FSDP2's own reduce-scatter)."""
    out = {}
    for engine, codec in (("ddp", "fp32"), ("scalesgd-fsdp", "fp32"), ("scalesgd-fsdp", "bf16"),
                          ("scalesgd-fsdp", "fp8"), ("scalesgd-fsdp", "topk"), ("fsdp2", "fp32")):
        torch.manual_seed(0)
        device = torch.device("cuda", rank)
        model = build_model("resnet8", 10, 3).to(device)
        if engine in SHARDED:
            ENGINES[engine].shard(model, MODELS["resnet8"].shard_units(model), "fp32", codec, device=device)
        exchange = build_exchange(engine, model, torch.optim.SGD(model.parameters(), lr=0.1),
                                  ExchangeSetup(codec, CodecSettings()))
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(8, 3, 16, 16, generator=g).to(device), torch.randint(0, 10, (8,), generator=g).to(device)
        exchange.backward(torch.nn.functional.cross_entropy(exchange.model(x), y))
        exchange.step()
        out[engine, codec] = {k: v.cpu() for k, v in exchange.model_state(model).items()}
        exchange.close()
    return out


def test_the_sharded_engine_steps_as_ddp_on_nccl():
    first = run_workers(sharded_and_not, gpus(), backend=CUDA_BACKEND)[0]
    whole = first["ddp", "fp32"]
    torch.manual_seed(0)
    start = build_model("resnet8", 10, 3).state_dict()
    moved = {engine: sum(int((first[engine][k].float() != start[k]).sum()) for k in start if start[k].ndim > 1)
             for engine in (("ddp", "fp32"), ("scalesgd-fsdp", "topk"))}
    if gpus() == 1:  # FSDP2 skips its reduce-scatter on one rank: nothing is exchanged, the step is DDP's
        assert moved["scalesgd-fsdp", "topk"] == moved["ddp", "fp32"], moved
    else:  # each rank's top-k (density 0.1) moves a share of the weights, not all of them
        assert moved["scalesgd-fsdp", "topk"] < 0.5 * moved["ddp", "fp32"], moved
    for engine, codec, atol in (("scalesgd-fsdp", "fp32", 1e-5), ("scalesgd-fsdp", "bf16", 1e-2),
                                ("scalesgd-fsdp", "fp8", 2e-2), ("fsdp2", "fp32", 1e-5)):
        sharded = first[engine, codec]
        assert sharded.keys() == whole.keys()
        assert all(torch.allclose(sharded[k].float(), whole[k].float(), atol=atol) for k in whole), codec
