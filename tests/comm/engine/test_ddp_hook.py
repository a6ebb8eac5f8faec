"""Every codec as a DDP comm hook: the same gradients as our engine with the same codec and buckets (DDP's several
buckets, rebuilt after the first iteration), residuals that survive the rebuild, state that round-trips and
pickles, a thread that stops, one clear error for an unknown codec."""

import os
import pickle

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from scalesgd.comm.codecs import CODECS, CodecSettings, Fp8Options, TopkOptions, make_codec
from scalesgd.comm.codecs.registry import (
    ASSUMED_EPOCH_STEPS,
    DENSE_START_EPOCHS,
    StepDefaults,
    step_defaults,
    with_steps_per_epoch,
)
from scalesgd.comm.engine.buckets import BucketPlan, model_tensors
from scalesgd.comm.engine.ddp_hook import CodecHookState, codec_hook
from scalesgd.comm.engine.optimizer import DistributedOptimizer
from scalesgd.optim import OneBitAdam
from scalesgd.config import TrainConfig
from scalesgd.models import build_model
from tests.comm.exchanging import same_state
from tests.spawn_util import run_workers

EXACT = Fp8Options(samples=10 ** 7)  # every tensor is smaller: quantiles exact, independent of sampling
SETTINGS = CodecSettings(EXACT, TopkOptions(density=0.05, reuse=2, density_warmup=0))  # the engine's: no warm-up
HOOK_CODECS = [name for name, entry in CODECS.items() if entry.build is not None and name != "fp32"]
CAP_MB = 0.05  # resnet8 (0.3 MB) in 4 DDP buckets once DDP rebuilds them after the first iteration


def batch(rank, step=0):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)


def fresh_model():
    torch.manual_seed(0)
    return build_model("resnet8", 10, 3)


def grads_of(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def backward(module, rank, step):
    x, y = batch(rank, step)
    torch.nn.functional.cross_entropy(module(x), y).backward()


def through_hook(codec, rank, steps=2):
    """Gradients of `steps` backward passes (no optimizer step) with the codec as DDP's hook, and the parameter
    numbers of each bucket DDP handed over, per step."""
    model = fresh_model()
    numbers = {id(p): i for i, p in enumerate(model.parameters())}
    state = CodecHookState(codec, settings=SETTINGS, model=model, compress_after=0)  # compressed from step one
    seen = []

    def recording_hook(state, bucket):
        seen[-1].append(tuple(numbers[id(p)] for p in bucket.parameters()))
        return codec_hook(state, bucket)

    ddp = DistributedDataParallel(model, bucket_cap_mb=CAP_MB)
    ddp.register_comm_hook(state, recording_hook)
    grads = []
    for step in range(steps):
        seen.append([])
        model.zero_grad()
        backward(ddp, rank, step)
        grads.append(grads_of(model))
    state.close()
    return grads, seen, state


def through_engine(codec, rank, plans):
    """The same passes through our engine, each with its own bucket plan, the codec's state carried between."""
    grads, saved = [], None
    for step, buckets in enumerate(plans):
        model = fresh_model()
        plan = buckets if isinstance(buckets, str) else BucketPlan("ddp", tuple(model_tensors(model)), buckets)
        engine = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                      codec=make_codec(codec, SETTINGS), buckets=plan)
        if saved is not None:
            engine.codec.load_state_dict(saved)
        backward(model, rank, step)
        engine.synchronize()
        grads.append(grads_of(model))
        saved = engine.codec.state_dict()
        engine.close()
    return grads


def hooks_against_engine(rank, world, local_world):
    os.environ["LOCAL_WORLD_SIZE"] = str(local_world)
    out = {}
    for codec in HOOK_CODECS:
        hooked, seen, _ = through_hook(codec, rank)
        own = CODECS[codec].buckets
        engine = through_engine(codec, rank, [own or tuple(buckets) for buckets in seen])
        out[codec] = (hooked, engine, [len(buckets) for buckets in seen])
    return out


@pytest.mark.parametrize("world, local_world", [(2, 1), (3, 3)])
def test_every_codec_as_a_hook_gives_the_engines_gradients(world, local_world):
    results = run_workers(hooks_against_engine, world, local_world)
    for codec in HOOK_CODECS:
        hooked, engine, buckets = results[0][codec]
        assert buckets[1] >= 3, (codec, buckets)  # several buckets once DDP rebuilt them
        for step, (h, e) in enumerate(zip(hooked, engine)):
            assert torch.equal(h, e), (codec, step, (h - e).abs().max())
            assert torch.isfinite(h).all() and h.abs().sum() > 0, codec
        for other in results[1:]:  # every rank holds the same mean
            assert all(torch.equal(a, b) for a, b in zip(other[codec][0], hooked)), codec


def owed_after_rebuild(rank, world):
    """Top-k through DDP for 3 passes (buckets rebuilt after the first): what was exchanged plus what the ranks
    still hold as residuals is the sum of the exact mean gradients, so nothing was lost in the rebuild."""
    hooked, seen, state = through_hook("topk", rank, steps=3)
    exact = []
    for step in range(3):
        model = fresh_model()
        backward(model, rank, step)
        mean = grads_of(model)
        torch.distributed.all_reduce(mean)
        exact.append(mean / world)
    codec = state.codec
    residual = torch.zeros_like(exact[0])
    offsets = torch.tensor([0] + [p.numel() for p in fresh_model().parameters()]).cumsum(0)
    for key, kept in codec.state_dict()["flat"]["params"].items():  # each parameter's residual, by its key
        residual[offsets[key]:offsets[key + 1]] = kept["residual"]
    torch.distributed.all_reduce(residual)
    return sum(hooked), residual / world, sum(exact), seen


def test_top_k_residuals_survive_ddps_bucket_rebuild():
    for sent, owed, exact, seen in run_workers(owed_after_rebuild, 2):
        assert len(seen[0]) != len(seen[1])  # DDP did regroup its buckets
        assert torch.allclose(sent + owed, exact, atol=1e-5), (sent + owed - exact).abs().max()
        assert owed.abs().sum() > 0  # top-k at 5 % did hold most of it back


def state_life(rank, world):
    """By name and by instance; the state round-trips, pickles with its codec's state, and stops."""
    hooked, _, state = through_hook("topk", rank, steps=1)
    saved = state.state_dict()
    again = CodecHookState(make_codec("topk", SETTINGS), compress_after=0)
    again.load_state_dict(saved)
    copied = pickle.loads(pickle.dumps(state))
    everyone = state.state_dicts_of_all_ranks()
    with pytest.raises(RuntimeError):  # no exchange runs after close()
        state._worker.submit(lambda: None)
    model = fresh_model()  # the unpickled state, bound to the model again, exchanges in a group of its own
    copied.bind(model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=CAP_MB)
    ddp.register_comm_hook(copied, codec_hook)
    backward(ddp, rank, 1)
    copied.close()
    again.close()
    return (saved, again.state_dict(), copied.state_dict(), everyone, state.bytes_sent, copied.bytes_sent,
            grads_of(model), state.counters())


def test_hook_state_round_trips_pickles_and_stops():
    results = run_workers(state_life, 2)
    for rank, (saved, loaded, _, everyone, sent_before, sent_after, grads, counters) in enumerate(results):
        assert same_state(saved, loaded)
        assert len(everyone) == 2 and same_state(everyone[rank], saved)
        assert not same_state(everyone[0], everyone[1])  # residuals are each rank's own
        assert sent_after > sent_before > 0  # the copy went on counting from where the original stood
        assert torch.isfinite(grads).all()
        assert 0 < counters["topk_density"] <= 1


def test_unknown_or_hookless_codec_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown codec 'fp9'; choose from fp32, fp16"):
        CodecHookState("fp9")
    with pytest.raises(ValueError, match="codec 'powersgd' has no scalesgd implementation"):
        CodecHookState("powersgd")


def test_a_hooks_default_codec_starts_dense_and_warms_its_density_up_as_the_registry_says():
    """No epochs known: the assumed epoch; and what `scalesgd train` does with its own defaults for the same epoch."""
    defaults = step_defaults()
    assert defaults == StepDefaults(ASSUMED_EPOCH_STEPS, round(DENSE_START_EPOCHS * ASSUMED_EPOCH_STEPS))
    state = CodecHookState("topk")
    assert state.driver.dense_first is not None and state.driver.dense_first.steps == defaults.dense_steps > 0
    dgc = state.codec.dgc
    assert dgc.warmup_epochs == TopkOptions().density_warmup > 0 and dgc.steps_per_epoch == defaults.steps_per_epoch
    assert state.codec.dgc.density_at(0.1, 0) > 0.1  # the ramp starts above the target density
    assert CodecHookState("fp8").driver.dense_first.steps == defaults.dense_steps  # every codec starts dense
    for spe in (37, ASSUMED_EPOCH_STEPS):  # told the epoch: exactly `scalesgd train`'s defaults for it
        train = TrainConfig.of(codec="topk")
        hook = CodecHookState("topk", steps_per_epoch=spe)
        assert hook.driver.dense_first.steps == train.compress_after_steps(spe) == step_defaults(spe).dense_steps
        assert hook.codec.dgc == make_codec("topk", train.codec_settings(spe)).dgc
    explicit = CodecHookState("topk", settings=CodecSettings(TopkOptions(density_warmup=0)), compress_after=0)
    assert explicit.driver.dense_first is None and explicit.codec.dgc.warmup_epochs == 0
    with pytest.raises(ValueError, match="compress_after -1"):
        CodecHookState("topk", compress_after=-1)


def test_the_settings_epoch_is_kept_as_given():
    """`scalesgd train --engine ddp` passes its settings (its epoch) and its dense steps: the hook changes neither."""
    settings = CodecSettings(TopkOptions(), steps_per_epoch=12, momentum=0.9)
    state = CodecHookState("topk", settings=settings, compress_after=30)
    assert state.codec.dgc == make_codec("topk", settings).dgc and state.driver.dense_first.steps == 30
    assert with_steps_per_epoch(settings, 12) is settings


def test_a_state_saved_with_another_dense_start_is_one_clear_error():
    old = CodecHookState("topk", compress_after=0).state_dict()
    with pytest.raises(ValueError, match="saved by a hook without a dense start"):
        CodecHookState("topk").load_state_dict(old)
    with pytest.raises(ValueError, match="saved by a hook with a dense start"):
        CodecHookState("topk", compress_after=0).load_state_dict(CodecHookState("topk").state_dict())


def test_a_hook_given_an_optimizer_that_freezes_adams_variance_starts_compressing_at_its_freeze():
    model = torch.nn.Linear(4, 2)
    optimizer = OneBitAdam(model.parameters(), lr=1e-3, betas=(0.9, 0.99))  # the horizon: 100 steps
    state = CodecHookState("onebit", model=model, optimizer=optimizer)
    assert state.driver.dense_steps == 100
    with pytest.raises(ValueError, match="compress_after 20 differs from the optimizer's freeze_step 100"):
        CodecHookState("onebit", model=model, optimizer=optimizer, compress_after=20)
    plain = CodecHookState("fp16", model=model, optimizer=torch.optim.AdamW(model.parameters()), compress_after=7)
    assert plain.driver.dense_steps == 7
