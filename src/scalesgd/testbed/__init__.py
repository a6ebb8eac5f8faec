"""A cluster on one machine: network namespaces joined by a bridge, each node's link shaped with tc."""

from scalesgd.testbed.netns import TestbedError, down, read_state, shape, status, up
from scalesgd.testbed.run import PREFIX_VARIABLE, run
from scalesgd.testbed.spec import TestbedSpec

__all__ = ["PREFIX_VARIABLE", "TestbedError", "TestbedSpec", "down", "read_state", "run", "shape", "status", "up"]
