"""The namespace testbed: up, a 2-node allreduce through shaped links, down, nothing left behind."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scalesgd.testbed import TestbedSpec as Spec
from scalesgd.testbed import netns
from tests.command import scalesgd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")
PREFIX = f"t{os.getpid() % 100000}"


def leftovers() -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
    return [n for n in names if n.startswith(f"{PREFIX}-")]


@pytest.fixture
def testbed():
    up = scalesgd("testbed", "up", "--nodes", "2", "--procs-per-node", "1", "--bandwidth", "500mbit",
                  "--prefix", PREFIX)
    assert up.returncode == 0, up.stderr
    try:
        yield PREFIX
    finally:
        scalesgd("testbed", "down", "--prefix", PREFIX)
        assert leftovers() == []
        assert list(Path("/etc/netns").glob(f"{PREFIX}-*")) == []  # the nodes' hosts files too


def burst(qdisc: str) -> int:
    """tbf's bucket in KiB, as `tc` shows it (in bytes rounded through its clock ticks, or in Kb)."""
    number, unit = re.search(r"burst (\d+)(b|Kb|Mb)", qdisc).groups()
    return round(int(number) * {"b": 1, "Kb": 1024, "Mb": 1024**2}[unit] / 1024)


def test_up_is_idempotent_and_status_shows_shaped_nodes(testbed):
    again = scalesgd("testbed", "up", "--nodes", "2", "--procs-per-node", "1", "--bandwidth", "500mbit",
                     "--prefix", testbed)
    assert again.returncode == 0
    status = json.loads(scalesgd("testbed", "status", "--prefix", testbed).stdout)
    assert [n["address"] for n in status["nodes"]] == ["10.213.0.1", "10.213.0.2"]
    assert all(n["up"] and "tbf" in n["qdisc"] and "500Mbit" in n["qdisc"] and burst(n["qdisc"]) == 256
               for n in status["nodes"])
    smaller = scalesgd("testbed", "up", "--nodes", "2", "--bandwidth", "500mbit", "--burst", "64kb", "--prefix",
                       testbed)
    assert smaller.returncode == 0 and "(64kb burst)" in smaller.stdout  # another spec: rebuilt with its bucket
    status = json.loads(scalesgd("testbed", "status", "--prefix", testbed).stdout)
    assert all(burst(n["qdisc"]) == 64 for n in status["nodes"]) and status["spec"]["burst"] == "64kb"
    assert sorted(leftovers()) == sorted([f"{testbed}-sw", f"{testbed}-n0", f"{testbed}-n1"])


def test_two_node_allreduce_runs_through_the_testbed_and_failures_pass_through(testbed, tmp_path):
    proc = scalesgd("testbed", "run", "--prefix", testbed, "--", "scalesgd", "bench", "allreduce", "--sizes",
                    "1K,256K", "--algorithms", "ring,native", "--repeats", "2", "--warmup", "1",
                    "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "allreduce.json").read_text())
    assert record["world_size"] == 2 and all(r["correct"] for r in record["results"])
    failing = scalesgd("testbed", "run", "--prefix", testbed, "--", "python", "-c",
                       "import os; raise SystemExit(7 if os.environ['RANK'] == '1' else 0)")
    assert failing.returncode == 7 and "worker rank 1 exited with status 7" in failing.stderr  # its own status
    assert len(leftovers()) == 3  # a failed command leaves the testbed as it was


def test_bad_spec_and_failed_build_leave_nothing_behind():
    bad = scalesgd("testbed", "up", "--bandwidth", "fast", "--prefix", PREFIX)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--bandwidth 'fast'" in bad.stderr
    with pytest.raises(ValueError, match="--nodes 0"):
        Spec(nodes=0).validate()
    assert leftovers() == []


@pytest.mark.parametrize("rate", ["0mbit", "0.5bit", "99999999999gbit"])
def test_a_rate_no_link_can_have_is_one_line(rate):
    bad = scalesgd("testbed", "up", "--bandwidth", rate, "--prefix", PREFIX)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and f"--bandwidth '{rate}'" in bad.stderr
    assert "1kbit to 100gbit" in bad.stderr and leftovers() == []


def test_down_and_up_touch_only_what_the_testbed_made():
    foreign = [f"{PREFIX}-n7", f"{PREFIX}-sw"]  # named like a testbed's, made by someone else
    try:
        for ns in foreign:
            subprocess.run(["ip", "netns", "add", ns], check=True)
        down = scalesgd("testbed", "down", "--prefix", PREFIX)
        assert down.returncode == 0 and sorted(leftovers()) == sorted(foreign)
        up = scalesgd("testbed", "up", "--prefix", PREFIX)
        assert up.returncode == 2 and up.stderr.count("\n") == 1 and f"{PREFIX}-sw exist" in up.stderr
        assert sorted(leftovers()) == sorted(foreign)  # refused, and nothing of theirs removed
    finally:
        for ns in foreign:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    assert leftovers() == []


def test_run_without_a_testbed_is_one_clear_line():
    proc = scalesgd("testbed", "run", "--prefix", "nonesuch", "--", "true")
    assert proc.returncode == 2 and "no testbed 'nonesuch' is up" in proc.stderr


def test_shaping_holds_within_ten_percent_of_the_set_rate(testbed, tmp_path):
    proc = scalesgd("testbed", "run", "--prefix", testbed, "--", "scalesgd", "bench", "link", "--megabytes", "8",
                    "--repeats", "5", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "link.json").read_text())["result"]
    # the best of 5 transfers: a loaded machine can slow a transfer, but only shaping caps the fastest
    assert abs(result["best_one_way_mbit_s"] - 500) <= 50
    assert abs(result["best_duplex_mbit_s_each_way"] - 500) <= 50  # the link is full duplex
    assert result["one_way_mbit_s"] <= 550
    assert (tmp_path / "link.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # time against size, α/β fit


def test_shape_changes_the_rate_in_place_and_a_bad_rate_is_one_line(testbed):
    done = scalesgd("testbed", "shape", "--bandwidth", "200mbit", "--prefix", testbed)
    assert done.returncode == 0, done.stderr
    status = json.loads(scalesgd("testbed", "status", "--prefix", testbed).stdout)
    assert status["spec"]["bandwidth"] == "200mbit"
    assert all("200Mbit" in n["qdisc"] and "500Mbit" not in n["qdisc"] for n in status["nodes"])
    bad = scalesgd("testbed", "shape", "--bandwidth", "quick", "--prefix", testbed)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--bandwidth 'quick'" in bad.stderr
    missing = scalesgd("testbed", "shape", "--bandwidth", "1gbit", "--prefix", "nonesuch")
    assert missing.returncode == 2 and "no testbed 'nonesuch' is up" in missing.stderr


def test_bench_train_sweeps_link_rates_and_puts_the_rate_back(testbed, tmp_path):
    proc = scalesgd("testbed", "run", "--prefix", testbed, "--", "scalesgd", "bench", "train", "--bandwidths",
                    "200mbit,1gbit", "--modes", "none,ddp,scalesgd-fp16", "--model", "resnet8", "--image-size", "8",
                    "--batch-size", "16", "--warmup", "1", "--iterations", "4", "--rounds", "2", "--out",
                    str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "train.json").read_text())["results"]
    assert [(r["bandwidth"], r["mode"]) for r in results] == [
        (rate, mode) for rate in ("200mbit", "1gbit") for mode in ("none", "ddp", "scalesgd-fp16")]
    for r in results:
        ratio, low, high = r["ddp_ratio"]
        assert len(r["round_medians_s"]) == 2 and low <= high and ratio > 0
    assert all(r["ddp_ratio"] == [1.0, 1.0, 1.0] for r in results if r["mode"] == "ddp")
    assert (tmp_path / "train.png").read_bytes()[:4] == b"\x89PNG"
    status = json.loads(scalesgd("testbed", "status", "--prefix", testbed).stdout)
    assert status["spec"]["bandwidth"] == "500mbit" and all("500Mbit" in n["qdisc"] for n in status["nodes"])


def in_node(node: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", node, *argv], capture_output=True, text=True, timeout=120,
                          check=True).stdout


def test_every_node_resolves_every_other_by_its_hosts_file(testbed):
    # an IPv6 socket sees a peer as ::ffff:10.213.0.2, and the rendezvous looks that up too
    for address in ("10.213.0.2", "::ffff:10.213.0.2"):
        assert in_node(f"{testbed}-n0", "getent", "hosts", address).split() == [address, f"{testbed}-n1"]


def test_a_link_taken_down_at_the_switch_is_seen_down_by_its_node_alone_and_comes_back(testbed):
    spec = netns.read_state(testbed)
    check = "from scalesgd.runtime.process_group import link_down; print(link_down({'GLOO_SOCKET_IFNAME': 'eth0'}))"
    netns.set_link(spec, 1, up=False)
    try:
        assert in_node(f"{testbed}-n1", sys.executable, "-c", check).strip() == "eth0"
        assert in_node(f"{testbed}-n0", sys.executable, "-c", check).strip() == "None"
    finally:
        netns.set_link(spec, 1, up=True)
    assert in_node(f"{testbed}-n1", "cat", "/sys/class/net/eth0/operstate").strip() == "up"


def forwarders() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout.splitlines()
    return [line for line in ps if "scalesgd.testbed.delay" in line and f"{PREFIX}p" in line]


def test_latency_adds_its_round_trip_keeps_the_rate_and_its_forwarders_end_with_the_testbed(tmp_path):
    up = scalesgd("testbed", "up", "--nodes", "2", "--bandwidth", "50mbit", "--latency", "10ms", "--prefix", PREFIX)
    assert up.returncode == 0, up.stderr
    try:
        assert len(forwarders()) == 2  # one a node
        proc = scalesgd("testbed", "run", "--prefix", PREFIX, "--", "scalesgd", "bench", "link", "--megabytes", "4",
                        "--repeats", "3", "--out", str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        result = json.loads((tmp_path / "link.json").read_text())["result"]
        assert 20 <= result["rtt_ms"] <= 30  # 10 ms each way, each node's uplink (and a loaded machine's ms)
        assert abs(result["best_one_way_mbit_s"] - 50) <= 5  # the shaper's rate, through the delay
        run = tmp_path / "auto"  # auto measures the link on the run's own group: it sees the delay
        proc = scalesgd("testbed", "run", "--prefix", PREFIX, "--", "scalesgd", "train", "--exchange", "auto",
                        "--auto-codecs", "fp32,fp16", "--workers", "2", "--dataset", "synthetic", "--samples", "256",
                        "--image-size", "12", "--model", "resnet8", "--epochs", "1", "--warmup", "none", "--quiet",
                        "--run-dir", str(run))
        assert proc.returncode == 0, proc.stderr
        alpha = json.loads((run / "auto.json").read_text())["link"]["inter"]["alpha_s"]
        assert 0.009 <= alpha <= 0.015  # half the round trip
        shaped = scalesgd("testbed", "shape", "--bandwidth", "20mbit", "--latency", "0", "--prefix", PREFIX)
        assert shaped.returncode == 0 and "links now 20mbit, 0 added latency" in shaped.stdout, shaped.stderr
        assert forwarders() == [] and json.loads(scalesgd("testbed", "status", "--prefix", PREFIX).stdout)["spec"][
            "latency"] == "0"  # rebuilt without them
    finally:
        scalesgd("testbed", "down", "--prefix", PREFIX)
    assert leftovers() == [] and forwarders() == []
