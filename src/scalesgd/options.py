"""Config fields that carry their own command-line option: declared once, parsed and checked from one place.

A config is a dataclass whose fields are made with `option(default, help, …)`. `add_options` turns
them into argparse arguments (flag, type, help with the choices and the default), `check_fields`
applies each field's choices and check (and to every number: finite, within 64 bits), and errors
name options in backticks so the CLI can show them as flags (`scalesgd.errors.as_flags`).

A field made with `expanded(…)` holds option objects of its own (a whole config, or one options object per
codec family): their options join the command line under the holder's prefix (`--fp8-headroom`), each with a
flat name (`fp8_headroom`) that records, errors and `build` use.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from scalesgd.checks import Check, finite, number
from scalesgd.errors import UsageError, option_name


class OptionParser(argparse.ArgumentParser):
    """argparse that reports a bad option as a UsageError (one line, no usage dump) instead of exiting."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, refusing `--flag=--`: argparse drops the `--` and leaves an option of one value an empty
        list, which no check expects."""
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            if action.nargs is None and isinstance(getattr(namespace, action.dest, None), list):
                self.error(f"argument {'/'.join(action.option_strings) or action.dest}: expected one argument")
        return namespace, extras


def parse(cls, argv: list[str], prog: str) -> dict:
    """The options of `cls` given in `argv`, by flat name (UsageError on an unknown or malformed one)."""
    parser = OptionParser(prog=prog)
    add_options(parser, cls)
    return given(parser.parse_args(argv))


def option(default: Any, help: str = "", *, choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
           check: Check | None = None,
           parse: Callable[[str], Any] | None = None, flag: str | None = None, group: str = "",
           shown_default: str | None = None, runtime: bool = False, remainder: bool = False,
           check_choices: bool = True, nonfinite: bool = False, positional: str | None = None,
           own: bool = False, required: bool = False, key: str | None = None) -> Any:
    """A dataclass field with its option: help, accepted names (a registry, a tuple or a function giving
    them), a check, how to parse it.

    `parse` defaults to the default's type; `flag` to --field-name (--prefix-field-name in an expanded holder; a
    bool defaulting to True needs its --no-… flag); `shown_default` replaces the default in the help (a function:
    given the default's text, what the help shows); `runtime`
    marks an option that says where and how a run executes, not what it computes; `remainder` takes everything
    after `--`; `positional` makes it an argument without a flag, taking that many values (argparse's nargs:
    None for one, "+" for one or more); `check_choices` False leaves the choices to a check that knows more (the
    codec's, the engine); `nonfinite` lets a number option take nan and ±inf, which every other one refuses;
    `own` marks an option of a codec family that applies to that family's codecs alone; `required` one the command
    line must give; `key` is its flat name where that is not the field's (a namespace's `model.name` is `model`, as
    config.json and the flag --model have it).
    """
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": choices, "check": check, "parse": parse, "flag": flag, "group": group,
        "shown_default": shown_default, "runtime": runtime, "remainder": remainder, "check_choices": check_choices,
        "nonfinite": nonfinite, "positional": positional, "own": own, "required": required, "key": key})


def expanded(parts: Callable[[], Iterable[tuple[str, type]]], make: Callable[[dict[str, Any]], Any],
             part: Callable[[Any, str], Any], group: str = "") -> Any:
    """A field holding option objects of its own: `parts()` names them (prefix, class) — read at each use, so a
    registry's later entries join —, `make({prefix: object})` builds the field's value (parts not given take their
    defaults) and `part(value, prefix)` reads one back. `group` titles their options in the help ({} is the
    prefix)."""
    return dataclasses.field(default_factory=lambda: make({}), metadata={
        "parts": parts, "make": make, "part": part, "group": group})


def nested(cls: type, group: str = "") -> Any:
    """A field holding a whole config of class `cls` (a namespace), its options on the command line and in records as
    if they were the holder's own, titled `group` in the help."""
    return expanded(lambda: [("", cls)], lambda given: given.get("") or cls(), lambda value, prefix: value, group)


class Options:
    """A command's options as a dataclass of `option` fields: by default checked by their own declarations alone and
    recorded by flat name; a command with rules between its options overrides `validate` (calling this one first)."""

    def validate(self):
        """UsageError naming the first option whose value its own check refuses; the options otherwise."""
        check_fields(self)
        return self

    def to_dict(self) -> dict:
        """The options by flat name, tuples as lists: what a command writes beside its results."""
        return record(self)


@dataclasses.dataclass(frozen=True)
class Flat:
    """One option as the command line and the records name it: its flat name, its field, the prefix it is under
    and the title of its group in the help."""

    name: str
    field: dataclasses.Field
    prefix: str = ""
    group: str = ""

    @property
    def flag(self) -> str:
        given = self.field.metadata["flag"]
        return given or option_name(self.name)


def flat_name(f: dataclasses.Field, prefix: str) -> str:
    """An option's flat name: its `key`, else its field's name under its prefix, or what its own flag spells
    (--density)."""
    if f.metadata.get("key"):
        return f.metadata["key"]
    flag = f.metadata["flag"]
    if prefix and flag and not flag.startswith("--no-"):
        return flag[2:].replace("-", "_")
    return f"{prefix}_{f.name}" if prefix else f.name


def _join(prefix: str, inner: str) -> str:
    return f"{prefix}_{inner}" if prefix and inner else prefix or inner


def _walk(cls, config=None, prefix: str = "", group: str = "") -> Iterator[tuple[Flat, Any]]:
    """Every option of `cls` in declaration order, expanded holders' options in place, with its value in
    `config` (None without one)."""
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "parts" in meta:
            value = getattr(config, f.name) if config is not None else None
            for inner, sub in meta["parts"]():
                title = meta["group"].format(inner) if meta["group"] else group
                held = meta["part"](value, inner) if config is not None else None
                yield from _walk(sub, held, _join(prefix, inner), title)
        elif "help" in meta:
            yield Flat(flat_name(f, prefix), f, prefix, meta["group"] or group), (
                getattr(config, f.name) if config is not None else None)


def flat_options(cls) -> list[Flat]:
    """Every option of a config class, expanded holders' included; ValueError where two share a flat name."""
    found = [flat for flat, _ in _walk(cls)]
    names = [flat.name for flat in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"options {twice} are declared twice in {cls.__name__}")
    return found


def flatten(config) -> dict[str, Any]:
    """A config's option values by flat name."""
    return {flat.name: value for flat, value in _walk(type(config), config)}


def build(cls, values: dict[str, Any], prefix: str = ""):
    """A config of class `cls` from option values by flat name (the others at their defaults)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "parts" in meta:
            kwargs[f.name] = meta["make"]({inner: build(sub, values, _join(prefix, inner))
                                           for inner, sub in meta["parts"]()})
        elif "help" in meta and flat_name(f, prefix) in values:
            kwargs[f.name] = values[flat_name(f, prefix)]
    return cls(**kwargs)


def option_fields(cls) -> list[dataclasses.Field]:
    """The fields of a config class that are options themselves (not expanded holders)."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def add_options(parser: argparse.ArgumentParser, cls) -> None:
    """One argument per option of `cls`; an option not given is absent from the parsed namespace."""
    groups: dict[str, Any] = {}
    for flat in flat_options(cls):
        f, meta = flat.field, flat.field.metadata
        target = parser
        if flat.group:
            target = groups.get(flat.group) or groups.setdefault(flat.group, parser.add_argument_group(flat.group))
        if meta["remainder"]:
            target.add_argument(flat.name, nargs=argparse.REMAINDER, default=argparse.SUPPRESS, help=help_of(f))
        elif meta["positional"] is not None:
            one = "?" if f.default not in (None, "", ()) else None  # one value, which a default may stand in for
            target.add_argument(flat.name, nargs=one if meta["positional"] == "1" else meta["positional"],
                                metavar=flat.name.upper(), type=meta["parse"] or _type_of(f), help=help_of(f),
                                **({"default": argparse.SUPPRESS} if one else {}))
        elif isinstance(f.default, bool):
            if f.default and not flat.flag.startswith("--no-"):
                raise ValueError(f"option {flat.name} defaults to True: its flag must be --no-…, got {flat.flag}")
            target.add_argument(flat.flag, dest=flat.name, action="store_false" if f.default else "store_true",
                                default=argparse.SUPPRESS, help=help_of(f))
        else:
            target.add_argument(flat.flag, dest=flat.name, type=meta["parse"] or _type_of(f),
                                default=argparse.SUPPRESS, help=help_of(f), required=meta["required"])


def _type_of(f: dataclasses.Field) -> Callable[[str], Any]:
    """How an option's text becomes its value: the type of its default (a str for a list of them)."""
    return str if isinstance(f.default, tuple) else type(f.default)


def help_of(f: dataclasses.Field) -> str:
    """The option's help as argparse shows it: its accepted names, what it does, its default."""
    text = describe(f)
    shown = default_text(f)
    if shown:
        text = f"{text} (default {shown})" if text else f"(default {shown})"
    return text.replace("%", "%%")  # argparse formats help with %


def describe(f: dataclasses.Field) -> str:
    """What an option accepts and does: `a | b: what it picks`."""
    meta = f.metadata
    parts = [" | ".join(map(shown_choice, choices_of(f)))] if meta["choices"] is not None else []
    if meta["help"]:
        parts.append(meta["help"])
    return ": ".join(parts)


def default_text(f: dataclasses.Field) -> str:
    """An option's default as the help shows it ("" where there is nothing to show: off, empty)."""
    shown = f.metadata["shown_default"]
    by_choice = shown if callable(shown) else None  # the default's text, then what a choice brings instead
    if (shown is None or by_choice) and not isinstance(f.default, bool) and f.default not in (None, "", ()):
        shown = value_text(f.default)
    return by_choice(shown if shown is not by_choice else "") if by_choice else shown or ""


def value_text(value: Any) -> str:
    """An option's value as the help shows it: a list comma-separated, a float in its shortest form."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else number(value)


def field_default(cls, name: str) -> Any:
    """The default of the option field `name` of a config class, without building one."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def given(namespace: argparse.Namespace, *leave_out: str) -> dict:
    """The options the user gave, by flat name (a list as a tuple, a remainder's leading `--` dropped)."""
    values = {k: v for k, v in vars(namespace).items() if k not in leave_out}
    for key, value in values.items():
        if isinstance(value, list):  # an argparse remainder, or several positional values
            values[key] = tuple(value[1:] if value[:1] == ["--"] else value)
    return values


def check_fields(config, prefix: str = "") -> None:
    """Each option's accepted names and check, then (numbers) finite and within 64 bits, in declaration order,
    expanded holders' options included; UsageError naming the first bad option by its flat name (under `prefix`
    for a config that is a part of another: an options object of the fp8 family checks as `fp8_…`)."""
    for flat, value in _walk(type(config), config, prefix):
        f = flat.field
        check = f.metadata["check"]
        if f.metadata["choices"] is not None and f.metadata["check_choices"]:
            for one in value if isinstance(value, tuple) else (value,):
                require_choice(flat.name, one, choices_of(f))
        refuse(flat.name, value, check(value) if check is not None else None)
        if not f.metadata["nonfinite"]:
            refuse(flat.name, value, finite(value))


def refuse(name: str, value: Any, problem: str | None) -> None:
    """UsageError naming `name` and its value when a check found a problem: one wording for every check."""
    if problem:
        shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
        raise UsageError(f"`{name}` {shown}: {problem}")


def own_and_set(flat, values: dict) -> bool:
    """Whether a family's own option (a codec's `density`) is on and not at its default in `values` (by flat name)."""
    value = values[flat.name]
    return bool(flat.field.metadata["own"] and value and value != flat.field.default)


def choices_of(f: dataclasses.Field) -> tuple[str, ...]:
    """The names an option accepts now (a registry, a tuple, or a function giving them, read at each use)."""
    choices = f.metadata["choices"]
    return tuple(choices() if callable(choices) else choices)


def require_choice(name: str, value: Any, choices: Iterable[str], context: str = "") -> None:
    names = tuple(choices)
    if value not in names:
        raise UsageError(f"`{name}` {value!r}{context} is not known; choose from {', '.join(map(shown_choice, names))}")


def shown_choice(name: str) -> str:
    """A choice as help and errors show it: the empty one as ''."""
    return name if name else "''"


def record(config) -> dict:
    """A config as written into JSON records: its options by flat name, tuples as lists."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in flatten(config).items()}


def runtime_fields(cls) -> frozenset[str]:
    """The flat names of the options that say where and how a run executes, not what it computes."""
    return frozenset(flat.name for flat in flat_options(cls) if flat.field.metadata["runtime"])


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


