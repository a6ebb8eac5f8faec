"""The `scalesgd` command: parse, validate once, dispatch, for every command in `scalesgd.commands.COMMANDS`.
Bad input is one line and exit status 2.

Every command's options are generated from its config's fields (`scalesgd.options`); library errors
name options in backticks, and this is the one place that shows them as --flags.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from scalesgd.commands import COMMANDS, GROUPS
from scalesgd.errors import EXIT_USAGE, Renamed, UsageError, as_flags, error_line
from scalesgd.options import OptionParser, add_options, given
from scalesgd.runtime import launcher, process_group

CHOSEN = "command"  # where the parser leaves the registered name of the command given


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per registered command (`GROUP VERB` nested under GROUP), each with its config's options."""
    parser = OptionParser(prog="scalesgd", description="Large-minibatch, communication-efficient data-parallel "
                          "training on PyTorch.")
    top = parser.add_subparsers(dest=f"{CHOSEN}_name", required=True, parser_class=OptionParser)
    nested: dict[str, argparse._SubParsersAction] = {}
    for name, command in COMMANDS.items():
        *group, verb = name.split()
        where = top
        if group:
            if group[0] not in nested:
                holder = top.add_parser(group[0], help=GROUPS[group[0]])
                nested[group[0]] = holder.add_subparsers(dest=f"{group[0]}_verb", required=True,
                                                         parser_class=OptionParser)
            where = nested[group[0]]
        sub = where.add_parser(verb, help=command.help, description=command.description or None)
        add_options(sub, command.config)
        sub.set_defaults(**{CHOSEN: name})
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; a process that joined a distributed launch ends with its launcher. The command's own process
    (no `argv`) ends without interpreter teardown: freeing torch's objects took 1.1-1.7 s of every command's time."""
    if argv is None:
        launcher.join_launcher()
    code = _run(argv)
    if argv is None:
        process_group.exit_process(code)
    return code


def _run(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.simplefilter("once", Renamed)
        warnings.showwarning = _show_renamed
        try:
            options = given(build_parser().parse_args(argv))
            command = COMMANDS[options.pop(CHOSEN)]
            for name in [f"{CHOSEN}_name", *(f"{group}_verb" for group in GROUPS)]:
                options.pop(name, None)
            return command.run(command.configure(options), argv)
        except UsageError as err:
            print(error_line(err), file=sys.stderr)
            return EXIT_USAGE


def _show_renamed(message, category, filename, lineno, file=None, line=None) -> None:
    """An earlier name the user typed, as one line (any other warning as Python shows it)."""
    if issubclass(category, Renamed):
        print(f"scalesgd: warning: {as_flags(str(message))}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


if __name__ == "__main__":
    sys.exit(main())
