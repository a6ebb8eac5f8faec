"""What a testbed is: N nodes of P processes on a private subnet, each node's link shaped."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from scalesgd.units import RATE, mbit_s, seconds

DELAY = re.compile(r"^(0|\d+(\.\d+)?(us|ms|s))$")
BURST = re.compile(r"^(\d+)(b|kb|mb)$")
BYTES_PER_UNIT = {"b": 1, "kb": 1024, "mb": 1024 ** 2}  # tc's sizes
MIN_BURST = 2048  # one full frame (1514 B) must fit, or tbf stalls the link
MIN_MBIT, MAX_MBIT = 1e-3, 1e5  # tbf shapes 1 kbit/s to 100 Gbit/s; 0 would stall every link
SUBNET = "10.213.{index}"  # a /24 inside namespaces this testbed creates, never a real network


@dataclass(frozen=True)
class TestbedSpec:
    """One testbed; every name it creates starts with `prefix`, so two testbeds never collide."""

    nodes: int = 2
    procs_per_node: int = 1
    bandwidth: str = "1gbit"
    latency: str = "0"
    prefix: str = "ssgd"
    subnet_index: int = 0
    burst: str = "256kb"  # what the token bucket sends at line rate after an idle spell

    def validate(self) -> TestbedSpec:
        if not 1 <= self.nodes <= 64:
            raise ValueError(f"--nodes {self.nodes}: must be in 1..64")
        if self.procs_per_node < 1:
            raise ValueError(f"--procs-per-node {self.procs_per_node}: must be >= 1")
        if not RATE.match(self.bandwidth) or not MIN_MBIT <= mbit_s(self.bandwidth) <= MAX_MBIT:
            raise ValueError(f"--bandwidth {self.bandwidth!r}: use a tc rate from 1kbit to 100gbit, such as 1gbit, "
                             "100mbit, 500kbit")
        if not DELAY.match(self.latency):
            raise ValueError(f"--latency {self.latency!r}: use 0 or a tc delay such as 100us, 1ms")
        if not BURST.match(self.burst) or self.burst_bytes < MIN_BURST:
            raise ValueError(f"--burst {self.burst!r}: use a tc size of at least 2kb (one frame), such as 16kb, 256kb")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", self.prefix):
            raise ValueError(f"--prefix {self.prefix!r}: 1-8 lower-case letters and digits, starting with a letter")
        if not 0 <= self.subnet_index <= 255:
            raise ValueError(f"--subnet-index {self.subnet_index}: must be in 0..255")
        return self

    @property
    def delayed(self) -> bool:
        """Whether links get an added delay (a forwarder of ours) besides the rate limit (tbf)."""
        return self.latency_s > 0

    @property
    def latency_s(self) -> float:
        return seconds(self.latency)

    @property
    def burst_bytes(self) -> int:
        number, unit = BURST.match(self.burst).groups()
        return int(number) * BYTES_PER_UNIT[unit]

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def node(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    def namespaces(self) -> list[str]:
        """Every namespace this testbed creates: the switch, then the nodes."""
        return [self.switch, *map(self.node, range(self.nodes))]

    def switch_port(self, i: int) -> str:
        return f"{self.prefix}p{i}"

    def delay_port(self, i: int) -> str:
        """The switch's end of node i's delay forwarder (where delayed frames leave it)."""
        return f"{self.prefix}d{i}"

    def bridge_port(self, i: int) -> str:
        """The bridge's port behind node i's delay forwarder."""
        return f"{self.prefix}b{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET.format(index=self.subnet_index)}.{i + 1}"

    def to_dict(self) -> dict:
        return asdict(self)
