import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalesgd.comm.engine.buckets import MB, TensorInfo, model_tensors, parse_spec, plan_buckets
from scalesgd.models import build_model


def tensors(sizes):
    return [TensorInfo(f"t{i}", n) for i, n in enumerate(sizes)]


sizes_strategy = st.lists(st.integers(1, 400_000), min_size=1, max_size=40)
specs = st.sampled_from(["size:1", "size:0.1", "growing", "growing:0.05:3", "layer", "single"])


@given(sizes_strategy, specs)
def test_every_tensor_once_consecutive_in_backward_order(sizes, spec):
    plan = plan_buckets(spec, tensors(sizes))
    flat = [i for bucket in plan.buckets for i in bucket]
    assert flat == list(range(len(sizes)))[::-1]


@given(sizes_strategy, st.floats(0.01, 2))
def test_size_plan_closes_each_bucket_once_it_reaches_the_target(sizes, mb):
    plan = plan_buckets(f"size:{mb}", tensors(sizes))
    for b, bucket in enumerate(plan.buckets[:-1]):
        assert plan.bucket_bytes(b) >= mb * MB
        assert plan.bucket_bytes(b) - plan.tensors[bucket[-1]].nbytes < mb * MB


def test_growing_plan_puts_few_layers_near_the_output_and_many_near_the_input():
    plan = plan_buckets("growing", model_tensors(build_model("resnet20", 10, 3)))
    counts = [len(b) for b in plan.buckets]
    assert counts[0] < counts[-1] or counts[0] < max(counts)
    assert plan.buckets[0][0] == len(plan.tensors) - 1  # starts with the last layer (fc.bias)
    targets = [0.25 * MB * 2 ** k for k in range(len(plan.buckets))]
    for b in range(len(plan.buckets) - 1):
        assert plan.bucket_bytes(b) >= targets[b]


def test_layer_and_single():
    ts = tensors([10, 20, 30])
    assert plan_buckets("layer", ts).buckets == ((2,), (1,), (0,))
    assert plan_buckets("single", ts).buckets == ((2, 1, 0),)


@pytest.mark.parametrize("bad", ["size", "size:0", "size:-1", "size:x", "growing:1:0.5", "layers", "single:3", ""])
def test_bad_specs_name_the_accepted_forms(bad):
    with pytest.raises(ValueError, match="size:MB, growing"):
        parse_spec(bad)


def test_plan_dict_and_table_describe_every_bucket():
    plan = plan_buckets("size:0.25", model_tensors(build_model("resnet20", 10, 3)))
    d = plan.to_dict()
    assert d["spec"] == "size:0.25" and len(d["buckets"]) == len(plan.buckets)
    assert sum(b["numel"] for b in d["buckets"]) == 272_474
    assert plan.table().row_count == len(plan.buckets)
