"""Rounds taken by whoever is alive: torchft's lighthouse decides each round's members from their heartbeats, and
a new torch.distributed group is built on the run's store for every membership it decides."""

from scalesgd.elastic.coordinator import Coordinator
from scalesgd.elastic.membership import ElasticMembership

__all__ = ["Coordinator", "ElasticMembership"]
