"""scalesgd's codecs as DDP communication hooks, for users who keep DistributedDataParallel.

    state = CodecHookState("fp8", model=model)  # collective: every rank, together
    model.register_comm_hook(state, codec_hook)

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

from scalesgd.comm.codecs import BucketView, Channel, Codec, CodecSettings, make_codec
from scalesgd.comm.topology import Topology
from scalesgd.comm.torch_hooks import on_thread


class CodecHookState:
    """A codec (a registered name or an instance), the process group it exchanges in (a new one by default),
    and the worker thread that runs the exchanges. Pass the `model` so per-tensor codec state is keyed by its
    parameter order, which a resumed run repeats whatever order DDP's buckets come in."""

    def __init__(self, codec="fp8", process_group=None, topology=None, settings: CodecSettings = None,
                 model: torch.nn.Module = None):
        group = process_group if process_group is not None else dist.new_group()
        self.codec: Codec = make_codec(codec, settings) if isinstance(codec, str) else codec
        if model is not None:
            self.codec.bind(list(model.parameters()))
        if topology is None and self.codec.needs_topology:
            topology = Topology.from_env().groups()
        self.channel = Channel(group, dist.get_world_size(group), "ring", topology)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scalesgd-ddp-hook")

    def state_dict(self) -> dict:
        return self.codec.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.codec.load_state_dict(state)

    def close(self) -> None:
        """Stop the worker thread once the exchanges in flight are done."""
        self._worker.shutdown(wait=True)

    def __getstate__(self):  # DDP may pickle its hook state; the thread cannot travel
        raise TypeError("CodecHookState holds a process group and a thread and cannot be pickled")


def codec_hook(state: CodecHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Encode → sum → decode the bucket with the state's codec; the future holds the mean gradient."""
    flat = bucket.buffer()
    params = bucket.parameters()
    offsets = list(itertools.accumulate((p.numel() for p in params[:-1]), initial=0))
    view = BucketView(bucket.index(), params, offsets, flat.numel())

    def exchange() -> torch.Tensor:
        state.codec.exchange(flat, view, state.channel)
        return flat

    return on_thread(state._worker, exchange, flat.device)
