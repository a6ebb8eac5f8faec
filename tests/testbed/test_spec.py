"""What a testbed is, as its spec reads it: the values it accepts, the names and addresses it gives (no root)."""

import pytest

from scalesgd.testbed.spec import TestbedSpec as Spec  # (a Test… name pytest would try to collect)


@pytest.mark.parametrize("changes,message", [
    ({"nodes": 0}, "--nodes 0: must be in 1..64"),
    ({"nodes": 65}, "--nodes 65: must be in 1..64"),
    ({"procs_per_node": 0}, "--procs-per-node 0: must be >= 1"),
    ({"bandwidth": "fast"}, "--bandwidth 'fast': use a tc rate from 1kbit to 100gbit"),
    ({"bandwidth": "200gbit"}, "--bandwidth '200gbit': use a tc rate from 1kbit to 100gbit"),
    ({"latency": "5"}, "--latency '5': use 0 or a tc delay such as 100us, 1ms"),
    ({"latency": "-1ms"}, "--latency '-1ms'"),
    ({"prefix": "Ab"}, "--prefix 'Ab': 1-8 lower-case letters and digits, starting with a letter"),
    ({"prefix": "abcdefghi"}, "--prefix 'abcdefghi'"),
    ({"burst": "1kb"}, "--burst '1kb': use a tc size of at least 2kb (one frame)"),
    ({"burst": "big"}, "--burst 'big'"),
    ({"subnet_index": 256}, "--subnet-index 256: must be in 0..255"),
])
def test_a_spec_names_the_value_it_refuses(changes, message):
    with pytest.raises(ValueError) as err:
        Spec(**changes).validate()
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("rate", ["1kbit", "100mbit", "12.5gbps", "100gbit"])
def test_rates_tc_can_shape_are_taken(rate):
    assert Spec(bandwidth=rate).validate().bandwidth == rate


def test_names_and_addresses_follow_the_prefix_and_subnet():
    spec = Spec(nodes=3, procs_per_node=2, prefix="t1", subnet_index=7, latency="0.5ms").validate()
    assert spec.world_size == 6 and spec.delayed and not Spec().delayed
    assert spec.namespaces() == ["t1-sw", "t1-n0", "t1-n1", "t1-n2"]
    assert [spec.address(i) for i in range(3)] == ["10.213.7.1", "10.213.7.2", "10.213.7.3"]
    assert spec.switch_port(2) == "t1p2" and Spec(**spec.to_dict()) == spec
    assert Spec(burst="16kb").validate().burst_bytes == 16384 and Spec().burst_bytes == 256 * 1024
