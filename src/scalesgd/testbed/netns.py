"""Building and removing a testbed with `ip` and `tc`: namespaces, a bridge, veth links, shaping, and a delay
forwarder a delayed node's link passes through on its way to the bridge."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from scalesgd.runtime.link import NODE_DEVICE
from scalesgd.testbed.spec import TestbedSpec

STATE_DIR = Path("/run/scalesgd")
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NAME` mounts the files of NETNS_ETC/NAME over /etc's
DEVICE = NODE_DEVICE  # every node's link, also what gloo binds to (GLOO_SOCKET_IFNAME)
TBF_LATENCY = "100ms"
STOP_S = 5.0  # a delay forwarder's time to end on SIGTERM before it is killed


class TestbedError(RuntimeError):
    """The testbed could not be built or used; the message says which command failed and why."""


def check_host() -> None:
    """Root and iproute2 are needed; say so in one line otherwise."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise TestbedError(f"{' and '.join(missing)} not found; install iproute2 (apt-get install iproute2)")
    if os.geteuid() != 0:
        raise TestbedError("the testbed creates network namespaces and needs root (run with sudo)")


def sh(*args: str) -> str:
    """Run one command; TestbedError with its stderr when it fails."""
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if proc.returncode:
        raise TestbedError(f"`{' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def namespaces() -> list[str]:
    return [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]


def state_file(prefix: str) -> Path:
    return STATE_DIR / f"testbed-{prefix}.json"


def read_state(prefix: str) -> TestbedSpec | None:
    path = state_file(prefix)
    if not path.exists():
        return None
    return TestbedSpec(**json.loads(path.read_text()))


def up(spec: TestbedSpec) -> TestbedSpec:
    """Create the testbed; the same spec twice is a no-op, a different one is rebuilt; partial work is undone."""
    check_host()
    existing = read_state(spec.prefix)
    if existing == spec and all(ns in namespaces() for ns in spec.namespaces()):
        return spec
    down(spec.prefix)
    taken = [ns for ns in spec.namespaces() if ns in namespaces()]
    if taken:
        raise TestbedError(f"namespaces {', '.join(taken)} exist but no testbed {spec.prefix!r} made them; "
                           "choose another --prefix (or remove them with `ip netns del`)")
    created: list[str] = []
    try:
        _build(spec, created)
        _write_hosts(spec)
    except BaseException:  # a failed command or Ctrl-C: leave nothing behind
        _stop_delays(spec.prefix)
        _remove(created)
        _remove_hosts(created)
        raise
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state_file(spec.prefix).write_text(json.dumps(spec.to_dict()))
    return spec


def _build(spec: TestbedSpec, created: list[str]) -> None:
    """Namespaces, bridge, links and shaping; each namespace is listed in `created` as soon as it exists."""
    sw = spec.switch
    sh("ip", "netns", "add", sw)
    created.append(sw)
    sh("ip", "-n", sw, "link", "set", "lo", "up")
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    for i in range(spec.nodes):
        node, port = spec.node(i), spec.switch_port(i)
        sh("ip", "netns", "add", node)
        created.append(node)
        sh("ip", "link", "add", port, "netns", sw, "type", "veth", "peer", "name", DEVICE, "netns", node)
        if spec.delayed:  # port → forwarder → delay_port ↔ bridge_port on the bridge
            sh("ip", "-n", sw, "link", "add", spec.delay_port(i), "type", "veth", "peer", "name", spec.bridge_port(i))
            sh("ip", "-n", sw, "link", "set", spec.bridge_port(i), "master", "br0", "up")
            sh("ip", "-n", sw, "link", "set", spec.delay_port(i), "up")
            sh("ip", "-n", sw, "link", "set", port, "up")
        else:
            sh("ip", "-n", sw, "link", "set", port, "master", "br0", "up")
        sh("ip", "-n", node, "addr", "add", f"{spec.address(i)}/24", "dev", DEVICE)
        sh("ip", "-n", node, "link", "set", DEVICE, "up")
        sh("ip", "-n", node, "link", "set", "lo", "up")
        _shape_node(spec, i, "add")
    if spec.delayed:
        _start_delays(spec)


def _start_delays(spec: TestbedSpec) -> None:
    """A forwarder a node, in the switch's namespace, holding what the node sends for the latency; their process
    ids in the state folder (for `down`), each started once its sockets are bound, what one says on failing in
    its `delay_log`."""
    pids = []
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    try:
        for i in range(spec.nodes):
            with open(delay_log(spec.prefix, i), "w") as said_to:
                proc = subprocess.Popen(["ip", "netns", "exec", spec.switch, sys.executable, "-m",
                                         "scalesgd.testbed.delay", spec.switch_port(i), spec.delay_port(i),
                                         str(spec.latency_s)],
                                        stdout=subprocess.PIPE, stderr=said_to, text=True, start_new_session=True)
            pids.append(proc.pid)
            said = proc.stdout.readline().strip()
            proc.stdout.close()
            if said != "ready":
                raise TestbedError(f"the delay forwarder of node {i} did not start (exit {proc.wait()}; "
                                   f"{delay_log(spec.prefix, i)} says why)")
    finally:
        delays_file(spec.prefix).write_text(json.dumps(pids))


def delays_file(prefix: str) -> Path:
    return STATE_DIR / f"testbed-{prefix}.delays"


def delay_log(prefix: str, node: int | str) -> Path:
    """Where node `node`'s forwarder says why it failed ("*": every node's, as a pattern)."""
    return STATE_DIR / f"testbed-{prefix}-delay{node}.log"


def _stop_delays(prefix: str) -> None:
    """End the forwarders `_start_delays` recorded (before their namespace goes: a process keeps one alive)."""
    path = delays_file(prefix)
    if not path.exists():
        return
    pids = json.loads(path.read_text())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + STOP_S
    for pid in pids:  # gone before `down` returns: a loaded machine runs a SIGTERM's handler late
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    path.unlink()
    for log in STATE_DIR.glob(delay_log(prefix, "*").name):
        log.unlink()


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (one of this process's own children, ended, is reaped here)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:  # not ours: started by an earlier `testbed up`
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _write_hosts(spec: TestbedSpec) -> None:
    """Each node's /etc/hosts names every node: a peer's address resolves there, not through a DNS server the
    namespace cannot reach (the rendezvous looks each peer up, and torch warns at every failed lookup)."""
    hosts = "".join(f"{address} {spec.node(i)}\n" for i in range(spec.nodes)  # and as an IPv6 socket sees it
                    for address in (spec.address(i), f"::ffff:{spec.address(i)}"))
    for i in range(spec.nodes):
        etc = NETNS_ETC / spec.node(i)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{hosts}")


def _remove_hosts(names: list[str]) -> None:
    """The hosts files `_write_hosts` wrote for these namespaces, and the folders left empty."""
    for ns in names:
        (NETNS_ETC / ns / "hosts").unlink(missing_ok=True)
    for folder in [NETNS_ETC / ns for ns in names] + [NETNS_ETC]:
        try:
            folder.rmdir()
        except OSError:  # absent, or holds what someone else put there
            pass


def _shape_node(spec: TestbedSpec, i: int, verb: str) -> None:
    """Upload: rate on the node's side (the delay after it, in the switch); download: rate on the switch's side."""
    rate = ["tbf", "rate", spec.bandwidth, "burst", spec.burst, "latency", TBF_LATENCY]
    sh("tc", "-n", spec.node(i), "qdisc", verb, "dev", DEVICE, "root", *rate)
    sh("tc", "-n", spec.switch, "qdisc", verb, "dev", spec.switch_port(i), "root", *rate)


def shape(prefix: str, bandwidth: str, latency: str | None = None) -> TestbedSpec:
    """Change the running testbed's link rate in place (its workers keep their connections); a new `latency`
    rebuilds it (the links change: connections through them end); the new spec."""
    check_host()
    current = read_state(prefix)
    if current is None:
        raise TestbedError(f"no testbed {prefix!r} is up; start one with `scalesgd testbed up --prefix {prefix}`")
    try:
        spec = dataclasses.replace(current, bandwidth=bandwidth, latency=latency or current.latency).validate()
    except ValueError as err:
        raise TestbedError(str(err)) from None
    if spec.latency_s != current.latency_s:
        return up(spec)
    for i in range(spec.nodes):
        _shape_node(spec, i, "change")
    state_file(prefix).write_text(json.dumps(spec.to_dict()))
    return spec


def set_link(spec: TestbedSpec, node: int, up: bool) -> None:
    """Take a node's link down (or bring it back) at the switch, as a cable pulled: the node sees its carrier go, its
    address and routes stay, and connections resume once it is back (if nothing timed out meanwhile)."""
    check_host()
    sh("ip", "-n", spec.switch, "link", "set", spec.switch_port(node), "up" if up else "down")


def down(prefix: str) -> list[str]:
    """Remove the namespaces (and so every link and qdisc) this prefix's state file lists; returns what was removed.

    Namespaces the testbed did not make are never touched, whatever their names.
    """
    check_host()
    spec = read_state(prefix)
    if spec is None:
        return []
    _stop_delays(prefix)
    removed = _remove(spec.namespaces())
    _remove_hosts(spec.namespaces())
    state_file(prefix).unlink(missing_ok=True)
    return removed


def _remove(names: list[str]) -> list[str]:
    """Delete those of `names` that exist; the ones deleted."""
    present = set(namespaces())
    removed = [ns for ns in names if ns in present]
    for ns in removed:
        sh("ip", "netns", "del", ns)
    return removed


def status(prefix: str) -> dict:
    """The testbed's spec and each node's address and qdiscs, or {} when none is up."""
    check_host()
    spec = read_state(prefix)
    present = set(namespaces())
    if spec is None:
        return {}
    nodes = []
    for i in range(spec.nodes):
        node = spec.node(i)
        qdiscs = sh("tc", "-n", node, "qdisc", "show", "dev", DEVICE).strip() if node in present else "missing"
        nodes.append({"namespace": node, "address": spec.address(i), "up": node in present, "qdisc": qdiscs})
    return {"spec": spec.to_dict(), "nodes": nodes}
