"""One registry per concept (models, datasets, codecs, …): the one list that choices, help, validation and
wiring all read. A registry may also take entries from outside the package: the modules named by an entry-point
group, imported the first time the registry is read."""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")

_LOADED: set[str] = set()  # entry-point groups whose modules this process has imported


class UnknownName(KeyError, ValueError):
    """A name no registry entry has; the message lists what is registered."""

    __str__ = Exception.__str__  # KeyError would quote the whole message


class Registry(Generic[T]):
    """Named entries of one concept in the order they were added; adding one is the only step a new entry needs.

    `plugins`: an entry-point group whose modules register entries when imported (once per process, before the
    registry is first read)."""

    def __init__(self, concept: str, plugins: str | None = None):
        self.concept = concept
        self.plugins = plugins
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.concept} {name!r} is registered already")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> T:
        return self._entries.pop(name)

    def __getitem__(self, name: str) -> T:
        try:
            return self._read()[name]
        except KeyError:
            raise UnknownName(f"unknown {self.concept} {name!r}; choose from {', '.join(self)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._read()

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._read()))

    def __len__(self) -> int:
        return len(self._read())

    def items(self) -> list[tuple[str, T]]:
        return list(self._read().items())

    def values(self) -> list[T]:
        return list(self._read().values())

    def _read(self) -> dict[str, T]:
        if self.plugins is not None and self.plugins not in _LOADED:
            load_plugins(self.plugins)
        return self._entries


def load_plugins(group: str) -> None:
    """Import every module the entry-point group names (once per process); one that fails is skipped, with a
    warning naming it and why."""
    _LOADED.add(group)  # first: a plugin that reads a registry while it registers must not load itself again
    for point in entry_points(group=group):
        try:
            loaded = point.load()
            if callable(loaded):  # `name = package.module:register` names a function that registers
                loaded()
        except Exception as err:  # a broken plugin must not take the package down with it
            warnings.warn(f"scalesgd plugin {point.name!r} ({point.value}) could not be loaded: "
                          f"{type(err).__name__}: {err}", stacklevel=2)
