"""What a worker knows of the testbed node it runs in: the variable that names the testbed, the node's link, and the
bytes the link has sent (the kernel's counter: every process and collective of the node)."""

from __future__ import annotations

import os
from pathlib import Path

TESTBED_VARIABLE = "SCALESGD_TESTBED"  # set in every worker: the testbed it runs on (a sweep reshapes it)
NODE_DEVICE = "eth0"  # every node's link, also what gloo binds to (GLOO_SOCKET_IFNAME)


def link_bytes_sent() -> int | None:
    """The bytes this worker's node has sent on its testbed link so far; None outside the testbed."""
    if not os.environ.get(TESTBED_VARIABLE):
        return None
    try:
        return int(Path(f"/sys/class/net/{NODE_DEVICE}/statistics/tx_bytes").read_text())
    except (OSError, ValueError):
        return None
