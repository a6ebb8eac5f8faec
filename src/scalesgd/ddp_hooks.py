"""scalesgd's codecs as DDP communication hooks, for users who keep DistributedDataParallel.

    state = Fp8HookState()                     # collective: every rank, together
    model.register_comm_hook(state, fp8_hook)

The hook is a pure function of (state, bucket); the state holds the codec (its ranges persist across
iterations and go into checkpoints through `state_dict`), where it exchanges, and one thread that
runs the exchanges in bucket order while backward goes on.
"""

# No `from __future__ import annotations`: DDP checks that the hook's `bucket` annotation is the
# real `dist.GradBucket`, not a string.
import itertools
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

from scalesgd.comm.codecs import BucketView, Codec, Exchange, Fp8Options, make_codec
from scalesgd.comm.topology import Topology


class CodecHookState:
    """A codec, the process group it exchanges in (a new one by default) and its worker thread."""

    def __init__(self, codec: str | Codec = "fp8", process_group=None, topology=None,
                 fp8_options: Fp8Options | None = None, seed: int = 0):
        group = process_group if process_group is not None else dist.new_group()
        self.codec = make_codec(codec, fp8_options, seed) if isinstance(codec, str) else codec
        if topology is None and self.codec.needs_topology:
            topology = Topology.from_env().groups()
        self.exchange = Exchange(group, dist.get_world_size(group), "ring", topology)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scalesgd-ddp-hook")

    def state_dict(self) -> dict:
        return self.codec.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.codec.load_state_dict(state)

    def __getstate__(self):  # DDP may pickle its hook state; the thread cannot travel
        raise TypeError("CodecHookState holds a process group and a thread and cannot be pickled")


class Fp8HookState(CodecHookState):
    """State for `fp8_hook`: SPEC §2's codec (or its ablations `fp8-direct`, `fp8-flat`)."""

    def __init__(self, process_group=None, topology=None, fp8_options: Fp8Options | None = None,
                 seed: int = 0, variant: str = "fp8"):
        if not variant.startswith("fp8"):
            raise ValueError(f"Fp8HookState variant must be fp8, fp8-direct or fp8-flat, got {variant!r}")
        super().__init__(variant, process_group, topology, fp8_options, seed)


def codec_hook(state: CodecHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Encode → sum → decode the bucket with the state's codec; the future holds the mean gradient."""
    flat = bucket.buffer()
    params = bucket.parameters()
    offsets = list(itertools.accumulate((p.numel() for p in params[:-1]), initial=0))
    view = BucketView(bucket.index(), params, offsets, flat.numel())
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def exchange() -> None:
        try:
            state.codec.exchange(flat, view, state.exchange)
            future.set_result(flat)
        except BaseException as err:  # DDP re-raises it when backward waits on the future
            future.set_exception(err)

    state._worker.submit(exchange)
    return future


fp8_hook = codec_hook  # the same function: which codec runs is the state's choice
