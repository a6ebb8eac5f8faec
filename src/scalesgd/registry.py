"""One registry per concept (models, datasets, codecs, …): the one list that choices, help, validation and
wiring all read."""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no registry entry has; the message lists what is registered."""

    __str__ = Exception.__str__  # KeyError would quote the whole message


class Registry(Generic[T]):
    """Named entries of one concept in the order they were added; adding one is the only step a new entry needs."""

    def __init__(self, concept: str):
        self.concept = concept
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
            return self._entries[name]
        except KeyError:
            raise UnknownName(f"unknown {self.concept} {name!r}; choose from {', '.join(self)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return list(self._entries.items())

    def values(self) -> list[T]:
        return list(self._entries.values())
