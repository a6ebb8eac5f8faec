"""One registry per concept (models, datasets, codecs, …): the one list that choices, help, validation and
wiring all read. A registry may also take entries from outside the package: the modules named by an entry-point
group, imported the first time the registry is read."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

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


class OptionFamilies(Mapping):
    """One options object per family of `registry` (family name → options class: a codec's, a model's), its
    family's defaults where none was given. Subclasses name the registry they hold."""

    registry: Registry[type]

    def __init__(self, given: Mapping[str, Any] | None = None):
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.registry))
        if unknown:
            raise ValueError(f"{self.registry.concept} {unknown} are not registered; known: {', '.join(self.registry)}")
        self._by_family = {name: given.get(name) or cls() for name, cls in self.registry.items()}

    @classmethod
    def of(cls, *options):
        """From options objects, each taken as the family its class is registered for."""
        families = {cls_: name for name, cls_ in cls.registry.items()}
        stray = [type(o).__name__ for o in options if type(o) not in families]
        if stray:
            raise ValueError(f"{', '.join(stray)} is not a registered {cls.registry.concept}")
        return cls({families[type(o)]: o for o in options})

    def __getitem__(self, family: str):
        return self._by_family[family]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_family)

    def __len__(self) -> int:
        return len(self._by_family)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._by_family!r})"
