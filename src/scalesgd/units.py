"""Link rates and delays as tc writes them (300mbit, 1gbit, 125mbps; 5us, 25ms): what the testbed shapes and the
simulator prices."""

from __future__ import annotations

import re

RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$")
MBIT_PER_UNIT = {"bit": 1e-6, "kbit": 1e-3, "mbit": 1.0, "gbit": 1e3, "bps": 8e-6, "kbps": 8e-3, "mbps": 8.0,
                 "gbps": 8e3}  # tc's bps are bytes per second


def mbit_s(rate: str) -> float:
    """A tc rate (300mbit, 1gbit, 125mbps) in Mbit/s."""
    number, unit = RATE.match(rate).groups()
    return float(number) * MBIT_PER_UNIT[unit]


LATENCY_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds(text: str) -> float:
    """A latency such as 5us, 0.2ms or 0: seconds (ValueError otherwise)."""
    for unit in sorted(LATENCY_UNITS, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[:-len(unit)]) * LATENCY_UNITS[unit]
    if text == "0":
        return 0.0
    raise ValueError(text)
