"""Errors that end a run with one clear line instead of a traceback."""

from __future__ import annotations

import re

EXIT_USAGE = 2
EXIT_PEER_LOST = 3
EXIT_NON_FINITE = 4

_FIELD = re.compile(r"`([a-z][a-z0-9_]*)`")


class UsageError(ValueError):
    """Bad input: one line, exit status 2, nothing written over.

    The message names configuration fields in backticks (`batch_size`); the command line shows
    them as its flags (--batch-size), see `as_flags`.
    """


class NoDevice(UsageError):
    """A worker has no GPU of its own: bad input met by that rank alone, so that rank says it."""


class NonFiniteLoss(RuntimeError):
    """The loss became inf/NaN: the run stops and the last good checkpoint is kept."""


class Renamed(FutureWarning):
    """A name the user typed is an older one's: it still works, and the warning says the new one (the command line
    shows it as one line)."""


class PeerLost(RuntimeError):
    """A collective failed because another worker died or stopped answering within the timeout."""


def option_name(field_name: str) -> str:
    """The command-line spelling of a config field."""
    return "--" + field_name.replace("_", "-")


def as_flags(message: str) -> str:
    """A library message for the command line: every `field` named in backticks becomes its --flag."""
    return _FIELD.sub(lambda m: option_name(m[1]), message)


def error_line(err: Exception) -> str:
    """The one line bad input ends with: options as --flags, and any line break or control character the input
    brought into the message (a value typed as $'a\\nb') escaped, so it cannot start a line of its own."""
    return "scalesgd: error: " + _UNPRINTABLE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"),
                                                   as_flags(str(err)))


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # control characters, and Unicode's line breaks
