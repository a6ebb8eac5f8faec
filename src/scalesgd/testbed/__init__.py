"""A cluster on one machine: network namespaces joined by a bridge, each node's link shaped with tc."""

from scalesgd.testbed.netns import TestbedError, down, status, up
from scalesgd.testbed.run import run
from scalesgd.testbed.spec import TestbedSpec

__all__ = ["TestbedError", "TestbedSpec", "down", "run", "status", "up"]
