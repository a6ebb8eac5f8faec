"""scalesgd's codecs as DDP communication hooks, for users who keep DistributedDataParallel (plain, in Lightning's
`DDPStrategy`, or after Accelerate's `prepare`).

    state = CodecHookState("fp8", model=model)
    ddp.register_comm_hook(state, codec_hook)

The hook is a pure function of (state, bucket); the state holds the codec (its ranges and residuals persist across
iterations, keyed by parameter, and go into checkpoints through `state_dict`), where it exchanges, and one thread
that runs the exchanges in bucket order while backward goes on, each through the same pipelined path as our own
engine's (`scalesgd.comm.engine.driver`). Codecs with a grouping of their own exchange in it
whatever DDP's buckets: `lags` one parameter at a time, `topk-global` everything at once after the last bucket.

Defaults are `scalesgd train`'s, in steps (`scalesgd.comm.codecs.registry.step_defaults`): each parameter's first
steps are exchanged dense (fp32), and top-k's density ramps up over its warm-up epochs, counted in the epoch length
given (`steps_per_epoch`) or an assumed one. What DDP can be asked for and what is refused: docs/hooks.md.
"""

# No `from __future__ import annotations`: DDP checks that the hook's `bucket` annotation is the
# real `dist.GradBucket`, not a string.
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import BucketView, Channel, Codec, CodecSettings
from scalesgd.comm.codecs.registry import (
    entry_of,
    step_defaults,
    with_steps_per_epoch,
)
from scalesgd.comm.engine.agreement import (
    check_ranks_agree,
    check_settings,
    codec_from,
    describe_exchange,
)
from scalesgd.comm.engine.driver import BucketDriver, offsets_of, open_channel
from scalesgd.comm.wire.futures import new_future, on_thread, settle
from scalesgd.comm.wire.groups import own_group


class CodecHookState:
    """A codec (a registered name or an instance), the process group it exchanges in (a new one by default, with
    the default group's timeout), and the worker thread that runs the exchanges.

    Pass the `model` so per-parameter codec state is keyed by its parameter order, which a resumed run repeats
    whatever order DDP's buckets come in. The state may be made before the process group exists (a Lightning
    script builds its strategy first): it then joins the group at the first exchange. It pickles (the codec and
    its state travel; the group and the thread are made again, and `bind` numbers the model's parameters again).
    Joining the group, every rank checks that all built the same codec, options and dense start (`RanksDisagree`,
    on every rank, where they did not).

    `compress_after`: each parameter's first steps are exchanged dense (fp32) before the codec takes over; None:
    `scalesgd train`'s default, the end of its LR warmup (5 epochs), in steps. `steps_per_epoch`: the epoch length
    that default and top-k's density warm-up count in; None: the settings' own, else an assumed one
    (`registry.ASSUMED_EPOCH_STEPS`). Pass `compress_after=0` to compress from the first step.
    `process_group`: a group of the hook's own (the default makes one); never DDP's, whose collectives would
    interleave with the hook's. `optimizer`: the one that steps with what the hook delivers; where it freezes Adam's
    variance (`OneBitAdam`, by default at Adam's averaging horizon 1/(1 − β2)), the dense start is its `freeze_step`
    (a different `compress_after` is refused). `scaler`: the loop's fp16 `GradScaler`: its scale is divided out of
    what a codec keeps across steps, and a step it skips leaves no trace in the codec (it is not pickled: pass it
    again).
    """

    def __init__(self, codec="fp8", process_group=None, topology=None, settings: CodecSettings = None,
                 model: torch.nn.Module = None, compress_after: int | None = None, steps_per_epoch: int | None = None,
                 scaler: torch.amp.GradScaler | None = None, optimizer: torch.optim.Optimizer | None = None):
        check_settings(settings)
        compress_after = _dense_start_of(optimizer, compress_after)
        settings = settings or CodecSettings()
        defaults = step_defaults(steps_per_epoch if steps_per_epoch is not None else settings.steps_per_epoch)
        if steps_per_epoch is not None or settings.steps_per_epoch is None:  # else the settings' own, as given
            settings = with_steps_per_epoch(settings, defaults.steps_per_epoch)
        codec = codec_from(codec, settings)
        if compress_after is not None and compress_after < 0:
            raise ValueError(f"compress_after {compress_after}: give the dense steps (0: none), or None for the "
                             f"default {defaults.dense_steps}")
        self.grouping = _grouping(codec)
        self.bytes_sent = 0  # what this rank has sent for the gradients, counted as the codec posts it
        self.driver = BucketDriver(codec, None,
                                   dense_steps=defaults.dense_steps if compress_after is None else compress_after)
        self.driver.follow(scaler)
        self._group, self._topology = process_group, topology
        self._held: list = []
        self._bound = False
        self._worker = _thread()
        if model is not None:
            self.bind(model)
        if dist.is_available() and dist.is_initialized():
            self.connect()  # collective: every rank, together

    def bind(self, model: torch.nn.Module) -> None:
        """Number the model's parameters (in its order) for the codec's per-parameter state."""
        self.driver.bind(list(model.parameters()))
        self._bound = True

    def register(self, ddp: DistributedDataParallel) -> None:
        """`ddp.register_comm_hook(self, codec_hook)`, after refusing what the hook cannot serve (one ValueError
        saying what and why), and numbering the wrapped model's parameters if no model was bound."""
        if self.grouping == "single" and getattr(ddp, "skip_all_reduce_unused_params", False):
            raise ValueError(f"codec {self.codec.name!r} with skip_all_reduce_unused_params=True is not supported: "
                             "it exchanges all buckets at once after DDP's last, which DDP skips when its "
                             "parameters are unused, so the step would wait forever; use topk")
        if self._group is not None and self._group is ddp.process_group:
            raise ValueError("the hook's process_group is DDP's own: its exchanges would interleave with DDP's "
                             "collectives (unused-parameter maps, buffers) and hang; leave process_group=None")
        if not self._bound:
            self.bind(ddp.module)
        ddp.register_comm_hook(self, codec_hook)

    @property
    def codec(self) -> Codec:
        """The codec (its per-parameter state is this rank's)."""
        return self.driver.codec

    @property
    def channel(self) -> Channel | None:
        return self.driver.channel

    def connect(self) -> Channel:
        """The channel the exchanges use, made on first use (collective: a new group, the check that every rank
        built the same exchange, and node groups for codecs that sum in two stages)."""
        if self.driver.channel is None:
            if self._group is None:
                self._group = own_group()
            group = self._group
            check_ranks_agree(describe_exchange(self.codec, self.driver.dense_steps), group)
            self.driver.channel = open_channel(self.codec, group, self._topology)
        return self.driver.channel

    def exchange(self, flat: torch.Tensor, view: BucketView) -> None:
        """Replace `flat` by the mean over ranks with the codec; count what was sent."""
        self.connect()
        self.bytes_sent += self.driver.exchange(flat, view)

    def counters(self) -> dict[str, float]:
        """The codec's guardrail counters since the last call (fp8 saturation, top-k density, …)."""
        return self.codec.counters()

    def state_dict(self) -> dict:
        """This rank's codec state (ranks differ: residuals are each rank's own)."""
        return self.driver.state_dict()

    def load_state_dict(self, state: dict) -> None:
        counted = isinstance(state, dict) and set(state) == {"inner", "done"}  # `DenseFirst.wrap`'s
        if counted != (self.driver.dense_first is not None):
            saved, here = ("with", "none") if counted else ("without", "one")
            raise ValueError(f"this state was saved by a hook {saved} a dense start and this one has {here}: build it "
                             "with the same compress_after (a hook's was 0 before its defaults had a dense start)")
        self.driver.load_state_dict(state)

    def state_dicts_of_all_ranks(self) -> list[dict]:
        """Every rank's `state_dict`, on every rank (collective, in the default group): what a checkpoint written by
        rank 0 alone must hold for each rank to resume exactly; load yours with `load_state_dict(states[rank])`."""
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, _to_cpu(self.state_dict()))
        return states

    def close(self) -> None:
        """Stop the worker thread once the exchanges in flight are done."""
        self._worker.shutdown(wait=True)

    def __getstate__(self) -> dict:
        return {"grouping": self.grouping, "bytes_sent": self.bytes_sent, "driver": self.driver}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._group, self._topology, self._held, self._worker, self._bound = None, None, [], _thread(), False


def codec_hook(state: CodecHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Encode → sum → decode the bucket with the state's codec; the future holds the mean gradient."""
    flat, params = bucket.buffer(), bucket.parameters()
    _refuse(state, flat)
    state.connect()  # a state made before the process group joins it here, in backward: a disagreement raises here
    if state.grouping == "single":
        return _hold_until_last(state, flat, params, bucket.index(), bucket.is_last())
    driver = state.driver
    if state.grouping == "layer":
        parts = [(driver.view(driver.key(p), [p], [0], p.numel()), flat[start:start + p.numel()])
                 for p, start in zip(params, offsets_of(params))]
    else:
        parts = [(driver.view(bucket.index(), params, offsets_of(params), flat.numel()), flat)]

    def exchange() -> torch.Tensor:
        for view, part in parts:
            state.exchange(part, view)
        return flat

    return on_thread(state._worker, exchange, flat.device)


def _refuse(state: CodecHookState, flat: torch.Tensor) -> None:
    """Raise, in backward on every rank alike and before any exchange, what the codec cannot take."""
    name = state.codec.name
    if flat.layout != torch.strided:
        raise ValueError(f"codec {name!r} exchanges dense gradients; DDP handed over a sparse one "
                         "(nn.Embedding(sparse=True) or similar): use sparse=False")
    entry = entry_of(state.codec)
    if flat.dtype != torch.float32 and entry is not None and entry.sparse:
        raise ValueError(f"codec {name!r} keeps float32 residuals and sums; DDP handed over {flat.dtype} "
                         "gradients (parameters in that dtype, or DDP's mixed_precision): keep float32 parameters "
                         "(autocast still computes in low precision) or use a cast codec")


def _hold_until_last(state: CodecHookState, flat: torch.Tensor, params: list, index: int,
                     last: bool) -> torch.futures.Future:
    """`topk-global`: keep each bucket until DDP hands over the last, then exchange all gradients as one, in the
    engine's order (the model's parameters, last first), and settle every bucket's future. Buckets come in index
    order: one that does not come after those held starts a new backward, and those held are a backward's that
    failed before its last bucket: they are dropped, not exchanged with this one's."""
    if state._held and index <= state._held[-1][3]:
        stale, state._held = state._held, []
        for _, _, waiting, _ in stale:
            waiting.set_exception(RuntimeError("a backward ended before DDP handed over its last bucket"))
    future = new_future(flat.device)
    state._held.append((flat, params, future, index))
    if not last:
        return future
    held, state._held = state._held, []

    def exchange() -> None:
        parts = sorted(((p, buffer[start:start + p.numel()]) for buffer, ps, _, _ in held
                        for p, start in zip(ps, offsets_of(ps))), key=lambda part: -state.driver.key(part[0]))
        whole = torch.cat([part for _, part in parts])
        params = [p for p, _ in parts]
        state.exchange(whole, state.driver.view(0, params, offsets_of(params), whole.numel()))
        for (_, part), mean in zip(parts, whole.split([part.numel() for _, part in parts])):
            part.copy_(mean)

    def run() -> None:
        try:
            exchange()
        except BaseException as err:  # noqa: BLE001 (every bucket's future fails alike; DDP raises it in backward)
            for _, _, waiting, _ in held:
                waiting.set_exception(err)
            return
        for buffer, _, waiting, _ in held:
            settle(waiting, lambda buffer=buffer: buffer)

    state._worker.submit(run)
    return future


def _grouping(codec: Codec) -> str | None:
    """The codec's own grouping (`layer`, `single`) when its registration has one; None: DDP's buckets."""
    entry = entry_of(codec)
    return entry.buckets if entry is not None else None


def _dense_start_of(optimizer, compress_after: int | None) -> int | None:
    """The dense start an optimizer that freezes Adam's variance at its end (`OneBitAdam`) needs: its freeze step, by
    default, and a different one refused (the codec would send momentum while the optimizer still takes gradients)."""
    freeze = getattr(optimizer, "freeze_step", None)
    if freeze is None:
        return compress_after
    if compress_after is not None and compress_after != freeze:
        raise ValueError(f"compress_after {compress_after} differs from the optimizer's freeze_step {freeze}: the "
                         "optimizer freezes Adam's variance where the codec starts to compress; leave "
                         "compress_after=None to take the optimizer's")
    return freeze


def _thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="scalesgd-ddp-hook")


def _to_cpu(state):
    """A state with its tensors on the CPU (what pickles for `all_gather_object` and loads on any device)."""
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_to_cpu(v) for v in state)
    return state
