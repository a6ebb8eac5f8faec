"""`scalesgd testbed up|down|status|shape|run`: each verb's options and what it does (root, on this machine)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from scalesgd.errors import UsageError
from scalesgd.options import Options, option
from scalesgd.testbed import netns
from scalesgd.testbed.netns import TestbedError
from scalesgd.testbed.run import run as run_in_nodes
from scalesgd.testbed.spec import TestbedSpec

PREFIX_HELP = "names of everything created start with this"
T = TypeVar("T")


def _said_once(work: Callable[[], T]) -> T:
    """A testbed's refusal (a bad spec, no root, no such testbed) is bad input: one line, exit status 2."""
    try:
        return work()
    except (ValueError, TestbedError) as err:
        raise UsageError(str(err)) from None


@dataclass
class TestbedUp(Options):
    """`scalesgd testbed up`: create (or keep) the testbed."""

    nodes: int = option(2, "nodes (network namespaces)")
    procs_per_node: int = option(1, "worker processes per node")
    bandwidth: str = option("1gbit", "each node's link rate, both ways")
    latency: str = option("0", "one-way delay added to each node's uplink, such as 25ms (a forwarder of ours in "
                               "user space: this kernel has no netem)")
    burst: str = option("256kb", "bytes a link sends at line rate after an idle spell (tc's token bucket): a real "
                        "link has none, so small rounds pay the link only with a burst of a few ms of its rate; "
                        "below ~4 ms tbf falls short of the rate (16kb at 500mbit gave 395 Mbit/s each way)")
    prefix: str = option("ssgd", PREFIX_HELP)

    def spec(self) -> TestbedSpec:
        return TestbedSpec(self.nodes, self.procs_per_node, self.bandwidth, self.latency, self.prefix, burst=self.burst)

    def validate(self) -> TestbedUp:
        super().validate()
        _said_once(self.spec().validate)
        return self


def up(cfg: TestbedUp, argv: list[str]) -> int:
    spec = cfg.spec()
    _said_once(lambda: netns.up(spec))
    print(f"testbed {spec.prefix}: {spec.nodes} nodes × {spec.procs_per_node} processes, "
          f"{spec.bandwidth} links ({spec.burst} burst), {spec.latency} added latency, node 0 at {spec.address(0)}")
    return 0


@dataclass
class TestbedPrefix(Options):
    """`scalesgd testbed down|status`: which testbed."""

    prefix: str = option("ssgd", PREFIX_HELP)


def down(cfg: TestbedPrefix, argv: list[str]) -> int:
    removed = _said_once(lambda: netns.down(cfg.prefix))
    print(f"removed {len(removed)} namespaces" + (f": {', '.join(removed)}" if removed else ""))
    return 0


def status(cfg: TestbedPrefix, argv: list[str]) -> int:
    print(json.dumps(_said_once(lambda: netns.status(cfg.prefix)) or {"up": False}, indent=2))
    return 0


@dataclass
class TestbedShape(Options):
    """`scalesgd testbed shape`: the running testbed's new link rate."""

    bandwidth: str = option("", "each node's link rate, both ways (a tc rate: 300mbit)", required=True)
    latency: str = option("", "one-way delay added to each node's uplink; a change rebuilds the links (connections "
                          "through them end)", shown_default="unchanged")
    prefix: str = option("ssgd", PREFIX_HELP)


def shape(cfg: TestbedShape, argv: list[str]) -> int:
    spec = _said_once(lambda: netns.shape(cfg.prefix, cfg.bandwidth, cfg.latency or None))
    print(f"testbed {spec.prefix}: links now {spec.bandwidth}, {spec.latency} added latency")
    return 0


@dataclass
class TestbedRun(Options):
    """`scalesgd testbed run`: a command's workers, one per node and local rank."""

    prefix: str = option("ssgd", PREFIX_HELP)
    timeout: float = option(300.0, "seconds the other workers get once one has failed")
    to_run: tuple[str, ...] = option((), "-- then the command, e.g. scalesgd bench link", remainder=True)


def run(cfg: TestbedRun, argv: list[str]) -> int:
    return _said_once(lambda: run_in_nodes(cfg.prefix, list(cfg.to_run), cfg.timeout))
