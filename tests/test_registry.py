"""Registries: entries in the order added, one name once, an unknown name answered with the known ones."""

import pytest

from scalesgd.registry import Registry, UnknownName


def test_entries_keep_their_order_and_lookups_name_the_choices():
    colours = Registry("colour")
    colours.add("red", 1)
    colours.add("green", 2)
    assert list(colours) == ["red", "green"] and colours["green"] == 2 and "red" in colours
    assert colours.items() == [("red", 1), ("green", 2)] and colours.values() == [1, 2] and len(colours) == 2
    with pytest.raises(UnknownName) as err:
        colours["blue"]
    assert str(err.value) == "unknown colour 'blue'; choose from red, green"
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)


def test_a_name_is_registered_once_and_can_be_removed():
    registry = Registry("thing")
    registry.add("a", object())
    with pytest.raises(ValueError, match="thing 'a' is registered already"):
        registry.add("a", object())
    registry.remove("a")
    assert "a" not in registry and list(registry) == []
