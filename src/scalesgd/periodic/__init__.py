"""Periodic synchronisation (DiLoCo, Streaming DiLoCo) around the user's loop, through any of our codecs."""

from scalesgd.periodic.diloco import DiLoCo
from scalesgd.periodic.fragments import split
from scalesgd.periodic.outer import outer_sgd
from scalesgd.periodic.schedule import Schedule

__all__ = ["DiLoCo", "Schedule", "outer_sgd", "split"]
