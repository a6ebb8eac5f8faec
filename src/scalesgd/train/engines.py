"""Wrapping model and optimizer in the chosen gradient-exchange engine: PyTorch DDP or scalesgd's own."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from scalesgd.config import TrainConfig
from scalesgd.trace import Tracer
from scalesgd.train.distributed import DistEnv

POWERSGD_RANK = 4
POWERSGD_START_ITER = 10  # plain allreduce for the first 10 iterations, PyTorch's documented warm start
# PowerSGD's hook issues its later allreduces from future callbacks; with several DDP buckets in
# flight, gloo ranks can issue them in different orders ("Received data size doesn't match
# expected size"). One bucket keeps a single chain in flight, so the baseline runs on gloo.
POWERSGD_BUCKET_MB = 1024


def wrap(cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer, env: DistEnv,
         tracer: Tracer, plan=None) -> tuple[nn.Module, object]:
    """(module to run forward/backward through, optimizer to step); backward+step average gradients.

    `plan`: the scalesgd engine's bucket plan when a planner chose it (else from the options).
    """
    if cfg.engine == "ddp":
        device_ids = [env.device.index] if env.device.type == "cuda" else None
        single_bucket = cfg.codec == "powersgd" and env.device.type != "cuda"
        ddp = DistributedDataParallel(model, device_ids=device_ids,
                                      bucket_cap_mb=POWERSGD_BUCKET_MB if single_bucket else None)
        _register_ddp_hook(ddp, cfg, env)
        return ddp, optimizer
    if cfg.engine == "scalesgd":
        from scalesgd.comm.engine import DistributedOptimizer

        from scalesgd.comm.codecs import make_codec

        codec = make_codec(cfg.codec, cfg.fp8_options(), cfg.seed, cfg.density, cfg.topk_reuse)
        engine = DistributedOptimizer(optimizer, model, codec=codec, algorithm=cfg.algorithm,
                                      buckets=plan or cfg.effective_buckets, group=env.exchange_group,
                                      topology=env.topology_groups, tracer=tracer)
        return model, engine
    raise ValueError(f"unknown engine {cfg.engine!r}")


def codec_of(net: nn.Module, opt):
    """The codec exchanging this run's gradients — the engine's or our DDP hook's — or None.

    Its state can differ between ranks (top-k residuals), so checkpoints keep one per rank.
    """
    if hasattr(opt, "codec"):
        return opt.codec
    state = getattr(net, "scalesgd_hook_state", None)  # our DDP hook's, see `_register_ddp_hook`
    return state.codec if state is not None else None


def _register_ddp_hook(ddp: DistributedDataParallel, cfg: TrainConfig, env: DistEnv) -> None:
    """PyTorch's own compression hooks (the baselines every speed claim is measured against), or ours."""
    codec = cfg.codec
    if codec.startswith("fp8"):
        from scalesgd.ddp_hooks import Fp8HookState, fp8_hook

        state = Fp8HookState(process_group=env.exchange_group, topology=env.topology_groups,
                             fp8_options=cfg.fp8_options(), seed=cfg.seed, variant=codec)
        ddp.register_comm_hook(state, fp8_hook)
        ddp.scalesgd_hook_state = state  # its state goes into checkpoints (see `codec_of`)
    elif codec == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif codec == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif codec == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                            start_powerSGD_iter=POWERSGD_START_ITER)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
