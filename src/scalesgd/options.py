"""Config fields that carry their own command-line option: declared once, parsed and checked from one place.

A config is a dataclass whose fields are made with `option(default, help, …)`. `add_options` turns
them into argparse arguments (flag, type, help with the choices and the default), `check_fields`
applies each field's choices and check (and to every number: finite, within 64 bits), and errors
name fields in backticks so the CLI can show them as flags (`scalesgd.errors.as_flags`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from scalesgd.checks import Check, finite, number
from scalesgd.errors import UsageError, option_name


class OptionParser(argparse.ArgumentParser):
    """argparse that reports a bad option as a UsageError (one line, no usage dump) instead of exiting."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


def parse(cls, argv: list[str], prog: str) -> dict:
    """The options of `cls` given in `argv`, as field values (UsageError on an unknown or malformed one)."""
    parser = OptionParser(prog=prog)
    add_options(parser, cls)
    return given(parser.parse_args(argv))


def option(default: Any, help: str = "", *, choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
           check: Check | None = None,
           parse: Callable[[str], Any] | None = None, flag: str | None = None, group: str = "",
           shown_default: str | None = None, runtime: bool = False, remainder: bool = False,
           check_choices: bool = True, nonfinite: bool = False) -> Any:
    """A dataclass field with its option: help, accepted names (a registry, a tuple or a function giving
    them), a check, how to parse it.

    `parse` defaults to the default's type; `flag` to --field-name (a bool defaulting to True needs
    its --no-… flag); `shown_default` replaces the default in the help; `runtime` marks an option
    that says where and how a run executes, not what it computes; `remainder` takes everything after
    `--`; `check_choices` False leaves the choices to a check that knows more (the codec's, the engine);
    `nonfinite` lets a number option take nan and ±inf, which every other one refuses.
    """
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": choices, "check": check, "parse": parse, "flag": flag, "group": group,
        "shown_default": shown_default, "runtime": runtime, "remainder": remainder, "check_choices": check_choices,
        "nonfinite": nonfinite})


def option_fields(cls) -> list[dataclasses.Field]:
    """The fields of a config class that are options (all of them, in a config made with `option`)."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or option_name(f.name)


def add_options(parser: argparse.ArgumentParser, cls) -> None:
    """One argument per option field of `cls`; an option not given is absent from the parsed namespace."""
    groups: dict[str, Any] = {}
    for f in option_fields(cls):
        meta = f.metadata
        target = parser
        if meta["group"]:
            target = groups.get(meta["group"]) or groups.setdefault(meta["group"],
                                                                    parser.add_argument_group(meta["group"]))
        if meta["remainder"]:
            target.add_argument(f.name, nargs=argparse.REMAINDER, default=argparse.SUPPRESS, help=help_of(f))
        elif isinstance(f.default, bool):
            flag = flag_of(f)
            if f.default and not flag.startswith("--no-"):
                raise ValueError(f"option {f.name} defaults to True: its flag must be --no-…, got {flag}")
            target.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true",
                                default=argparse.SUPPRESS, help=help_of(f))
        else:
            target.add_argument(flag_of(f), dest=f.name, type=meta["parse"] or type(f.default),
                                default=argparse.SUPPRESS, help=help_of(f))


def help_of(f: dataclasses.Field) -> str:
    """The option's help: its accepted names, what it does, its default."""
    meta = f.metadata
    parts = [" | ".join(choices_of(f))] if meta["choices"] is not None else []
    if meta["help"]:
        parts.append(meta["help"])
    text = ": ".join(parts)
    shown = meta["shown_default"]
    if shown is None and not isinstance(f.default, bool) and f.default not in (None, "", ()):
        shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else number(f.default)
    if shown:
        text = f"{text} (default {shown})" if text else f"(default {shown})"
    return text.replace("%", "%%")  # argparse formats help with %


def given(namespace: argparse.Namespace, *leave_out: str) -> dict:
    """The options the user gave, as field values (a remainder's leading `--` dropped)."""
    values = {k: v for k, v in vars(namespace).items() if k not in leave_out}
    for key, value in values.items():
        if isinstance(value, list):  # an argparse remainder
            values[key] = tuple(value[1:] if value[:1] == ["--"] else value)
    return values


def check_fields(config) -> None:
    """Each option's accepted names and check, then (numbers) finite and within 64 bits, in field order; UsageError
    naming the first bad `field`."""
    for f in option_fields(config):
        value = getattr(config, f.name)
        check = f.metadata["check"]
        if f.metadata["choices"] is not None and f.metadata["check_choices"]:
            for one in value if isinstance(value, tuple) else (value,):
                require_choice(f.name, one, choices_of(f))
        refuse(f.name, value, check(value) if check is not None else None)
        if not f.metadata["nonfinite"]:
            refuse(f.name, value, finite(value))


def refuse(name: str, value: Any, problem: str | None) -> None:
    """UsageError naming `name` and its value when a check found a problem: one wording for every check."""
    if problem:
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
        raise UsageError(f"`{name}` {shown}: {problem}")


def choices_of(f: dataclasses.Field) -> tuple[str, ...]:
    """The names an option accepts now (a registry, a tuple, or a function giving them, read at each use)."""
    choices = f.metadata["choices"]
    return tuple(choices() if callable(choices) else choices)


def require_choice(name: str, value: Any, choices: Iterable[str], context: str = "") -> None:
    names = tuple(choices)
    if value not in names:
        raise UsageError(f"`{name}` {value!r}{context} is not known; choose from {', '.join(names)}")


def record(config) -> dict:
    """A config as written into JSON records (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def runtime_fields(cls) -> frozenset[str]:
    return frozenset(f.name for f in option_fields(cls) if f.metadata["runtime"])


# ---- parsers of list options -------------------------------------------------------------------------

def words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(w) for w in words(text))


def floats_of(what: str) -> Callable[[str], tuple[float, ...]]:
    """A parser of comma-separated numbers whose error says what they are (epochs, …)."""
    def parse(text: str) -> tuple[float, ...]:
        try:
            return tuple(float(w) for w in words(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}") from None
    return parse


def sizes(text: str) -> tuple[int, ...]:
    """Element counts like 256,4K,1M (K = 1024, M = 1024²)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return tuple(int(float(w[:-1]) * scale[w[-1].upper()]) if w[-1].upper() in scale else int(w)
                     for w in words(text))
    except (ValueError, IndexError, OverflowError):  # OverflowError: infK
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of element counts like 256,4K,1M") from None


