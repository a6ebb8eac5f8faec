"""Ranks that built different exchanges are stopped at construction, on every rank, in one line naming both values;
the engines' own groups time out when the caller said; a codec argument that is not one is refused clearly."""

import re
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from scalesgd import CodecHookState, DistributedOptimizer, RanksDisagree, codec_hook
from scalesgd.comm.codecs import CodecSettings, make_codec
from scalesgd.comm.codecs.registry import options_from_flat
from scalesgd.comm.engine.agreement import describe_codec, disagreement
from scalesgd.comm.wire.groups import own_group
from tests.spawn_util import run_workers

CALLER_TIMEOUT = timedelta(seconds=3)
SAME = "every rank must build the same exchange"


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


def _shorten_caller_timeout():
    """The caller's timeout, short (spawn_util's workers join with 60 s): where the check let ranks through to
    different collectives, the test fails in seconds instead of hanging."""
    dist.distributed_c10d._set_pg_timeout(CALLER_TIMEOUT)


def _hook(codec):
    return CodecHookState(codec, model=_model())  # the process group exists: it joins its group here


def _engine(options):
    """The engine around a stand-in for the optimizer, which construction reads only the parameter groups of (torch's
    first optimizer in a process imports its compiler, seconds in every worker); never stepped."""
    model = _model()
    return DistributedOptimizer(SimpleNamespace(param_groups=[{"params": list(model.parameters())}]), model,
                                **options)


def _built(rank, world, build, per_rank):
    """Build with this rank's argument: the RanksDisagree message (None where it was built) and the seconds taken."""
    _shorten_caller_timeout()
    start = time.monotonic()
    try:
        build(per_rank[rank]).close()
    except RanksDisagree as err:
        return str(err), time.monotonic() - start
    return None, time.monotonic() - start


def _raised_alike_and_fast(results, message):
    assert [text for text, _ in results] == [message, message]
    assert all(seconds < CALLER_TIMEOUT.total_seconds() for _, seconds in results)


# ---- ranks that disagree ---------------------------------------------------------------------------------------
def test_hooks_with_different_codecs_raise_on_both_ranks_naming_both():
    results = run_workers(_built, 2, _hook, ["fp16", "topk"])
    _raised_alike_and_fast(results, f"ranks disagree on the codec: rank 0 built fp16, rank 1 built topk; {SAME}")


def test_engines_with_different_codecs_raise_on_both_ranks_naming_both():
    results = run_workers(_built, 2, _engine, [{"codec": "fp16"}, {"codec": "fp8"}])
    _raised_alike_and_fast(results, f"ranks disagree on the codec: rank 0 built fp16, rank 1 built fp8; {SAME}")


def test_engines_with_different_bucket_plans_raise_on_both_ranks_naming_both():
    results = run_workers(_built, 2, _engine, [{"buckets": "layer"}, {"buckets": "single"}])
    _raised_alike_and_fast(results, "ranks disagree on the bucket plan: rank 0 built 4 buckets of 2, 16, 8, 32 "
                                    f"elements, rank 1 built 1 bucket of 58 elements; {SAME}")


def _first_bucket(rank, world, states):
    """A state made before the process group existed (as a Lightning script does) joins it at the first bucket DDP
    hands the hook (here by hand, as DDP calls it: building DDP imports torch's compiler, seconds in every worker):
    the RanksDisagree message the hook raised (None where it ran)."""
    _shorten_caller_timeout()
    params = list(_model().parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    bucket = SimpleNamespace(buffer=lambda: flat, parameters=lambda: params, index=lambda: 0, is_last=lambda: True)
    try:
        codec_hook(states[rank], bucket).wait()
    except RanksDisagree as err:
        return str(err)
    finally:
        states[rank].close()
    return None


def test_hooks_made_before_the_group_raise_at_the_first_bucket_on_both_ranks():
    states = [CodecHookState("fp16"), CodecHookState("topk")]  # no process group here: none joined yet
    for state in states:
        state.close()
    message = f"ranks disagree on the codec: rank 0 built fp16, rank 1 built topk; {SAME}"
    assert run_workers(_first_bucket, 2, states) == [message, message]


def test_hooks_built_alike_on_every_rank_pass():
    assert [text for text, _ in run_workers(_built, 2, _hook, ["topk", "topk"])] == [None, None]


def test_engines_built_alike_on_every_rank_pass():
    assert [text for text, _ in run_workers(_built, 2, _engine, [{"codec": "fp8"}, {"codec": "fp8"}])] == [None, None]


def test_the_message_names_the_codec_options_that_differ():
    sparse, sparser = (describe_codec(make_codec("topk", CodecSettings(options_from_flat({"density": d}))))
                       for d in (0.1, 0.01))
    described = [{"codec": "topk", "codec's options": codec} for codec in (sparse, sparser)]
    assert disagreement(described) == ("ranks disagree on the codec's options: rank 0 built topk (density 0.1), "
                                       f"rank 1 built topk (density 0.01); {SAME}")


def test_the_message_names_the_dense_start_and_the_first_bucket_whose_parameters_differ():
    dense = [{"dense start (compress_after)": steps} for steps in (0, 1000)]
    assert disagreement(dense) == ("ranks disagree on the dense start (compress_after): rank 0 built 0 dense steps, "
                                   f"rank 1 built 1000 dense steps; {SAME}")
    plans = [{"bucket plan": ((10, (1,)), (5, (0, *moved)))} for moved in ((), (2,))]
    assert disagreement(plans) == ("ranks disagree on the bucket plan: rank 0 built bucket 1 of 5 elements "
                                   f"(parameters 0), rank 1 built bucket 1 of 5 elements (parameters 0, 2); {SAME}")


# ---- the groups' timeout ---------------------------------------------------------------------------------------
def _group_timeouts(rank, world):
    _shorten_caller_timeout()
    hook, engine = _hook("fp16"), _engine({})
    groups = [own_group(), hook.channel.group, engine.group]
    hook.close()
    engine.close()
    return [group._get_backend(torch.device("cpu")).options._timeout for group in groups]


def test_the_engines_groups_time_out_when_the_caller_said():
    assert run_workers(_group_timeouts, 2) == [[CALLER_TIMEOUT] * 3] * 2


def _alone_in_a_collective(rank, world):
    """Rank 0 sums in a group of its own that rank 1 never sums in: the seconds until it gives up."""
    _shorten_caller_timeout()
    group = own_group()
    seconds = None
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(RuntimeError):
            dist.all_reduce(torch.ones(1), group=group)
        seconds = time.monotonic() - start
    dist.barrier(timeout=timedelta(seconds=30))  # rank 1 stays until rank 0 gave up
    return seconds


def test_a_rank_left_alone_in_an_own_group_collective_fails_after_the_caller_s_timeout():
    seconds = run_workers(_alone_in_a_collective, 2)[0]
    assert CALLER_TIMEOUT.total_seconds() * 0.9 < seconds < 20  # not gloo's 30 minutes, nor spawn_util's 60 s


# ---- arguments that are not a codec ----------------------------------------------------------------------------
@pytest.mark.parametrize("codec", [42, None, CodecSettings()])
def test_a_codec_that_is_neither_a_name_nor_a_codec_is_refused_naming_what_is_accepted(codec):
    for build in (lambda: CodecHookState(codec), lambda: _engine({"codec": codec})):
        with pytest.raises(TypeError, match=re.escape(f"codec {codec!r}: give a registered codec's name (fp32, fp16, ")
                           + r".*\) or a Codec instance"):
            build()


def test_an_unknown_codec_name_is_refused_by_both_engines_listing_the_registered_ones():
    for build in (lambda: CodecHookState("nosuch"), lambda: _engine({"codec": "nosuch"})):
        with pytest.raises(ValueError, match=r"unknown codec 'nosuch'; choose from fp32, fp16, .*, or pass a Codec "
                                             "instance"):
            build()


def test_settings_given_as_a_dict_are_refused_saying_how_to_build_them():
    with pytest.raises(TypeError, match=r"settings \{'density': 0.5\} is a dict; give a CodecSettings: "
                                        r"CodecSettings\(options_from_flat\(\{'density': 0.5\}\)\)"):
        CodecHookState("topk", settings={"density": 0.5})
    state = CodecHookState("topk", settings=CodecSettings(options_from_flat({"density": 0.5})))  # as it says
    state.close()
    assert state.codec.density == 0.5
