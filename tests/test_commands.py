"""The one command registry: every command is a config and a run, docs/cli.md is made from their declarations."""

from pathlib import Path

from scalesgd import commands
from scalesgd.cli import build_parser
from scalesgd.commands import COMMANDS, GROUPS, cli_markdown
from scalesgd.options import flat_options

ROOT = Path(__file__).resolve().parents[1]


def test_docs_cli_md_is_what_the_declarations_say_now():
    written = (ROOT / commands.DOCS_CLI).read_text(encoding="utf-8")
    assert written == cli_markdown(), "docs/cli.md is stale: run `scalesgd docs cli`"


def test_the_markdown_names_every_command_and_every_option():
    text = cli_markdown()
    for name, command in COMMANDS.items():
        assert f"## `scalesgd {name}`" in text
        for flat in flat_options(command.config):
            meta = flat.field.metadata
            if meta["positional"] is None and not meta["remainder"]:
                assert f"`{flat.flag}`" in text, (name, flat.flag)
    assert "`--fp8-headroom` | 128 |" in text and "`--density` | 0.1 |" in text  # codec families' options too


def test_the_parser_offers_each_registered_command_once_under_its_group():
    parser = build_parser()
    top = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    names = []
    for name in top:
        if name in GROUPS:
            verbs = next(a for a in top[name]._actions if a.__class__.__name__ == "_SubParsersAction").choices
            names += [f"{name} {verb}" for verb in verbs]
        else:
            names.append(name)
    assert names == list(COMMANDS)
    assert {"train", "plan", "profile", "compare", "sweep", "simulate", "bench train", "testbed run",
            "docs cli"} <= set(names)


def test_cli_py_holds_no_per_command_code():
    source = (ROOT / "src" / "scalesgd" / "cli.py").read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f'"{name.split()[-1]}"' not in source, name
