"""Fuzzing `scalesgd train` and `scalesgd bench train` from their option declarations: whatever the command line
holds (flags, lists, empty and unicode text, huge numbers, nan, paths that do not exist), the command either
validates or ends with exit status 2 and one `scalesgd: error:` line, never a traceback, before any worker starts;
and every `--modes` string either names a valid mode, whose name reads back as the same mode, or is refused with one
line.

No worker starts here: the options are parsed and validated as `main` does, and `main` itself runs with every
command's `run` replaced by one that stops where the launch would begin.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalesgd import checks, cli
from scalesgd.bench.train import TrainBenchConfig
from scalesgd.comm.codecs import CODECS
from scalesgd.comm.engine.exchange import exchange_names
from scalesgd.commands import COMMANDS
from scalesgd.config import TrainConfig, rules
from scalesgd.errors import EXIT_USAGE, UsageError, error_line
from scalesgd.options import Flat, build, choices_of, flat_options, parse
from scalesgd.sim.modes import Mode, parse_mode

FUZZED = ("train", "bench train")
VALIDATED = 0  # what a command's stand-in run returns: every check passed, the launch would begin here
# fixed budgets, the same examples every run: the two properties take about 20 s together on two shared cores (a
# command line about 45 ms: it is validated twice, once through `main`; a mode string about 10 ms)
COMMAND_LINES = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.too_slow])
MODE_STRINGS = settings(COMMAND_LINES, max_examples=500)

# text a user may type anywhere (no NUL: a command line cannot hold one; \udcff: a byte that is not UTF-8)
HOSTILE = ("", " ", ",", ",,", "-", "--", "=", "nan", "NaN", "inf", "-inf", "+inf", "1e400", "-1e400", "1e308",
           "1e39", "-0", "0", "0.0", "1", "-1", "2", "3.5", "0.5", "1e-300", "5e-324", str(2**63), str(-2**63 - 1),
           "9" * 30, "9" * 5000, "0x10", "1_000", "٣", "１", "½", "∞", "é", "日本語", "💥", "a\nb", "\t", "\r", "\x1b[31m",
           "\udcff", "nonexistent/dir/file", "/nonexistent/x", "/dev/null", ".", "..", "/", "~", "-h", "--seed", "a,b",
           "size:1", "%s", "%(prog)s", "{}", "`seed`", "'", '"', "\\")
SMALL_INTS = st.sampled_from(("0", "1", "2", "3", "4", "8", "16", "64", "256"))
SMALL_FLOATS = st.sampled_from(("0", "1", "2", "0.1", "0.5", "1e-3", "0.9", "0.999", "128"))
TEXT = st.text(st.characters(exclude_characters="\x00"), max_size=12)
HOSTILE_TEXT = st.one_of(st.sampled_from(HOSTILE), TEXT)
INTS = st.one_of(st.sampled_from((0, 1, -1, 2**31, 2**32, 2**63 - 1, 2**63, 10**30, -10**30)), st.integers())
NUMBERS = {"int": st.one_of(SMALL_INTS, INTS.map(str)), "float": st.one_of(SMALL_FLOATS, st.floats().map(repr))}

# ---- mode strings, from what each part of a mode accepts ----------------------------------------------------------

TRAIN_FLATS = {flat.name: flat for flat in flat_options(TrainConfig)}
ALGORITHMS = choices_of(TRAIN_FLATS["algorithm"].field)
WIRES = tuple(choice for name in ("factor_wire", "topk_wire") for choice in choices_of(TRAIN_FLATS[name].field))
PLANNERS = choices_of(TRAIN_FLATS["planner"].field)
BUCKETS = ("size:1", "size:0.5", "size:0", "size:-1", "size:nan", "size:1e400", "growing", "growing:1:2",
           "growing:1:0.5", "layer", "single", *(f"planner:{p}" for p in PLANNERS), "planner:bogus", "")
AMOUNTS = ("", "0", "1", "2", "4", "0.01", "0.5", "1e-05", "1e-5", "1E-2", "-1", "-0.5", "nan", "inf", "1e400", "٣",
           "9" * 30, "1.5", "1e", "e-5", "4@5")


def _part(sep: str, values) -> st.SearchStrategy[str]:
    """`sep + value` or nothing."""
    return st.one_of(st.just(""), st.sampled_from(values).map(lambda v: sep + v), TEXT.map(lambda v: sep + v))


@st.composite
def built_modes(draw) -> str:
    """A mode string assembled from real and hostile parts: engine, codec, @amount, /wire, -algorithm, -buckets."""
    engine = draw(st.sampled_from(("none", "ddp", "scalesgd", "auto", "nonesuch")))
    if engine == "auto":
        names = draw(st.lists(st.one_of(st.sampled_from(exchange_names()), HOSTILE_TEXT), max_size=3))
        listed = draw(st.sampled_from(("", "-"))) + "+".join(names) if names or draw(st.booleans()) else ""
        return engine + (("-" + listed.lstrip("-")) if listed else "") + draw(_part("@", AMOUNTS))
    codec = draw(_part("-", tuple(CODECS)))
    tail = draw(_part("-", ALGORITHMS))
    if tail:
        tail += draw(_part("-", BUCKETS))
    return engine + codec + draw(_part("@", AMOUNTS)) + draw(_part("/", WIRES)) + tail


MUTATIONS = "-@/+:.,0123456789eE_ "


@st.composite
def mutated(draw, base: st.SearchStrategy[str]) -> str:
    """A mode string with a few characters deleted, inserted, doubled or replaced."""
    text = draw(base)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        how = draw(st.sampled_from(("delete", "insert", "double", "replace", "cut")))
        char = draw(st.one_of(st.sampled_from(MUTATIONS), st.characters(exclude_characters="\x00")))
        if how == "delete":
            text = text[:at] + text[at + 1:]
        elif how == "insert":
            text = text[:at] + char + text[at:]
        elif how == "double":
            text = text[:at] + text[at:at + 1] + text[at:]
        elif how == "replace":
            text = text[:at] + char + text[at + 1:]
        else:
            text = text[:at]
    return text


MODE_TEXTS = st.one_of(built_modes(), mutated(built_modes()), TEXT)


# ---- command lines, from the option declarations -----------------------------------------------------------------

def _kind(flat: Flat) -> str:
    """What an option holds: bool, int, float or str, for a list (`tuple`) each of its values."""
    f = flat.field
    if isinstance(f.default, bool):
        return "bool"
    text = str(f.type)
    return next((kind for kind in ("int", "float") if kind in text), "str")


FORM_NUMBERS = st.one_of(st.sampled_from(("1", "2", "10", "0", "-1", "0.5", "1e308", "1e400", "nan", "inf", "-0",
                                          str(2**63), "9" * 30, "", "1e-300", "٣")), INTS.map(str),
                         st.floats().map(repr))


def help_forms(flat: Flat) -> tuple[str, ...]:
    """The value forms an option's help and default show (`EPOCHSep`, `size:MB`, `growing[:FIRST_MB[:FACTOR]]`,
    `100mbit`), each number or upper-case placeholder made a slot: `{}ep`, `size:{}`, `growing:{}:{}`, `{}mbit`."""
    f = flat.field
    default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else str(f.default or "")
    forms = set()
    for word in re.split(r"[\s|,;()]+", f"{f.metadata['help']} {default}"):
        word = word.replace("[", "").replace("]", "").strip(".:")
        if re.search(r"[0-9]|[A-Z]{2}|^N", word):
            forms.add(re.sub(r"[A-Z][A-Z_]*|[0-9]+(?:\.[0-9]+)?", "{}", word.replace("{", "").replace("}", "")))
    return tuple(sorted(form for form in forms if "{}" in form))


def values_of(flat: Flat) -> st.SearchStrategy[str]:
    """The text of a value of this option: one it is declared to accept (a choice, its default, a small number, a
    mode) or a hostile one; a list option's values joined by commas."""
    f, kind = flat.field, _kind(flat)
    if flat.name == "modes":
        one = MODE_TEXTS
    elif f.metadata["choices"] is not None:
        one = st.one_of(st.sampled_from(choices_of(f)), HOSTILE_TEXT)
    elif kind in ("int", "float"):
        one = st.one_of(NUMBERS[kind], HOSTILE_TEXT)
    elif help_forms(flat):  # STEPS, EPOCHSep, size:MB, 100mbit: the forms its help names, with any number
        one = st.one_of(st.tuples(st.sampled_from(help_forms(flat)), st.lists(FORM_NUMBERS, min_size=2, max_size=2))
                        .map(lambda drawn: drawn[0].format(*drawn[1])), HOSTILE_TEXT)
    else:
        one = HOSTILE_TEXT
    default = f.default if not isinstance(f.default, tuple) else ",".join(map(str, f.default))
    plain = st.just(str(default)) if default not in (None, dataclasses.MISSING) else one
    if isinstance(f.default, tuple) or "tuple" in str(f.type):
        listed = st.lists(one, max_size=3).map(",".join)
        return st.one_of(plain, listed, one)
    return st.one_of(plain, one)


def rendered(flat: Flat) -> st.SearchStrategy[list[str]]:
    """The option on the command line: a bool's flag (or the flag with a value it does not take), else `--flag VALUE`
    or `--flag=VALUE`."""
    if _kind(flat) == "bool":
        return st.one_of(st.just([flat.flag]), st.just([flat.flag, flat.flag]),
                         HOSTILE_TEXT.map(lambda v: [f"{flat.flag}={v}"]))
    return st.tuples(values_of(flat), st.booleans()).map(
        lambda pair: [f"{flat.flag}={pair[0]}"] if pair[1] else [flat.flag, pair[0]])


OPTIONS = {name: {flat.name: flat for flat in flat_options(COMMANDS[name].config)} for name in FUZZED}
RENDERED = {name: {key: rendered(flat) for key, flat in flats.items()} for name, flats in OPTIONS.items()}
STRAY = st.sampled_from((["--bogus"], ["--bogus", "1"], ["stray"], ["--"], ["--", "x"], ["-x"], ["--batch"], ["-"]))


@st.composite
def command_lines(draw, name: str) -> list[str]:
    """Up to six of a command's options in any order, now and then a token it does not know."""
    chosen = draw(st.lists(st.sampled_from(sorted(OPTIONS[name])), max_size=6, unique=True), label="options")
    argv = [token for key in chosen for token in draw(RENDERED[name][key], label=key)]
    if draw(st.integers(0, 9)) == 7:  # not 0: hypothesis favours the ends of a range
        at = draw(st.integers(0, len(argv)))
        argv[at:at] = draw(STRAY)
    return argv


# ---- running it -------------------------------------------------------------------------------------------------

def _stop_before_launch(cfg, argv) -> int:
    """A command's run up to where the launch begins: the warnings `scalesgd train` prints first, then nothing."""
    config = getattr(cfg, "config", None)
    if isinstance(config, TrainConfig):
        rules.advice(config)
    return VALIDATED


@pytest.fixture(scope="module")
def nothing_launches(tmp_path_factory):
    """Each command's run replaced by `_stop_before_launch`, in an empty directory, with the checks of a local
    launch (not under torchrun: the strictest)."""
    with pytest.MonkeyPatch.context() as patch:
        for variable in checks.LAUNCH_VARIABLES:
            patch.delenv(variable, raising=False)
        patch.setattr(cli, "COMMANDS", {name: dataclasses.replace(command, run=_stop_before_launch)
                                        for name, command in COMMANDS.items()})
        here = tmp_path_factory.mktemp("fuzz")
        patch.chdir(here)
        yield here


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """`scalesgd ARGV` in this process: its exit status, stdout and stderr (an exception escapes, as a traceback
    would reach the user)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exit_:  # argparse's own exit (help, a usage dump): never meant to happen
            raise AssertionError(f"scalesgd {argv} exited through SystemExit({exit_.code}): {err.getvalue()!r}")
    return code, out.getvalue(), err.getvalue()


def validated(name: str, argv: list[str]) -> str | None:
    """None where `scalesgd NAME ARGV` validates, else its error as the command line shows it (UsageError only:
    anything else escapes)."""
    command = COMMANDS[name]
    try:
        command.configure(parse(command.config, argv, f"scalesgd {name}"))
    except UsageError as err:
        return error_line(err)
    return None


def one_line(line: str) -> bool:
    """No line break of any kind (str.splitlines'), and no Python object shown where a value or reason belongs."""
    return not any(char in line for char in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029") and not re.search(
        r"<[\w.]+ (object )?at 0x[0-9a-f]+>|<function ", line)


def figures_aside(message: str) -> str:
    """A message with its numbers blanked: the memory available moves between two checks of the same input."""
    return re.sub(r"[0-9][0-9.,]*", "#", message)


def assert_one_line_or_valid(name: str, argv: list[str], workdir) -> None:
    """Validating and `main` agree: both accept (exit 0 from the stand-in run, nothing printed), or both refuse,
    `main` with exit 2 and one line `scalesgd: error: …`, the very error validating raised where it is not
    argparse's (whose message names the parser that found it). Nothing is written."""
    problem = validated(name, argv)
    code, out, err = run_main([*name.split(), *argv])
    assert out == "", (argv, out)
    if problem is None:
        assert (code, err) == (VALIDATED, ""), (argv, code, err)
    else:
        assert code == EXIT_USAGE, (argv, code, err)
        assert err.startswith("scalesgd: error: ") and err.endswith("\n") and one_line(err[:-1]), (argv, err)
        assert one_line(problem), (argv, problem)
        if not problem.startswith("scalesgd: error: scalesgd"):  # argparse's, naming the parser that found it
            assert figures_aside(err) == figures_aside(f"{problem}\n"), (argv, err, problem)
    assert os.listdir(workdir) == [], (argv, os.listdir(workdir))


@COMMAND_LINES
@given(data=st.data())
def test_any_command_line_validates_or_is_one_line_and_exit_2(nothing_launches, data):
    name = data.draw(st.sampled_from(FUZZED), label="command")
    assert_one_line_or_valid(name, data.draw(command_lines(name), label="argv"), nothing_launches)


# ---- modes ------------------------------------------------------------------------------------------------------

def spelled(mode: Mode) -> str:
    """A parsed mode written out in full, every part named: `scalesgd-CODEC[@AMOUNT][/WIRE]-ALGORITHM-BUCKETS`,
    `ddp-CODEC[@RANK]`, `auto-EXCHANGE+…[@DENSITY]`, `none`."""
    given = dict(mode.given)
    if mode.engine == "none":
        return "none"
    if mode.engine == "auto":
        return f"auto-{mode.codec}" + (f"@{given['density']!r}" if "density" in given else "")
    entry = CODECS[mode.codec]
    text = f"{mode.engine}-{mode.codec}"
    if entry.amount in given:
        text += f"@{given[entry.amount]!r}"
    if entry.wire_option in given:
        text += f"/{given[entry.wire_option]}"
    return text + (f"-{mode.algorithm}-{mode.buckets}" if mode.engine == "scalesgd" else "")


def parts(mode: Mode) -> tuple:
    return mode.engine, mode.codec, mode.algorithm, mode.buckets, mode.given


def assert_mode_valid_or_refused_in_one_line(text: str) -> None:
    """`parse_mode` and `bench train`'s validation agree: the text names a valid mode, whose name and whose full
    spelling read back as the same mode, or both refuse it with one line (UsageError, nothing else)."""
    try:
        mode = parse_mode(text)
    except UsageError as err:
        assert one_line(str(err)), (text, str(err))  # the mode shown as repr(text)
        mode = None
    try:
        build(TrainBenchConfig, {"modes": (text,)}).validate()
        refused = None
    except UsageError as err:
        refused = error_line(err)
        assert one_line(refused), (text, refused)
    if mode is None:
        assert refused is not None, f"bench train takes {text!r}, which parse_mode refuses"
        return
    assert mode.name == text and parse_mode(mode.name) == mode, text  # the table's label names this very mode
    assert mode.engine in ("none", "ddp", "scalesgd", "auto"), mode
    if mode.engine == "auto":
        assert set(mode.auto_codecs) <= set(exchange_names()), mode
    else:
        assert mode.codec in CODECS, mode
    mode.options  # every codec option it sets is one the codecs take  # noqa: B018
    again = parse_mode(spelled(mode))
    assert parts(again) == parts(mode), (text, spelled(mode))


@MODE_STRINGS
@given(text=MODE_TEXTS)
def test_any_mode_string_is_a_valid_mode_or_one_line(nothing_launches, text):
    assert_mode_valid_or_refused_in_one_line(text)


# ---- what fuzzing found, each by name ---------------------------------------------------------------------------

def refused_line(argv: list[str]) -> str:
    """The one line `scalesgd ARGV` ends with, exit status 2 (asserted)."""
    code, out, err = run_main(argv)
    assert (code, out) == (EXIT_USAGE, ""), (argv, code, out, err)
    assert err.startswith("scalesgd: error: ") and err.endswith("\n") and one_line(err[:-1]), (argv, err)
    return err[:-1]


@pytest.mark.parametrize("mode, words", [
    ("scalesgd-lowrank@", "--modes scalesgd-lowrank@: mode 'scalesgd-lowrank@': give its rank after the @"),
    ("scalesgd-lowrank@4/",
     "--modes scalesgd-lowrank@4/: mode 'scalesgd-lowrank@4/': give its factor_wire after the /"),
], ids=["rank", "wire"])
def test_an_empty_rank_or_wire_is_refused_not_taken_for_the_default(nothing_launches, mode, words):
    """Found by hand: the empty rank or wire was taken silently and the table labelled `scalesgd-lowrank@`."""
    assert refused_line(["bench", "train", "--modes", mode]) == f"scalesgd: error: {words}"


def test_an_auto_mode_naming_no_known_exchange_lists_those_accepted(nothing_launches):
    line = refused_line(["bench", "train", "--modes", "auto-bogus+fp32"])
    assert line.startswith("scalesgd: error: --modes auto-bogus+fp32: mode 'auto-bogus+fp32': exchange 'bogus' is not "
                           "known; choose from fp32, fp16, "), line
    assert line.endswith(f"choose from {', '.join(exchange_names())}")


EMPTY_OR_UNUSED = [
    ("scalesgd-", "give its codec after the -"),  # each was a plain scalesgd-fp32 under another name
    ("scalesgd-fp32-", "give its algorithm after the -"),
    ("scalesgd-fp32-ring-", "give its buckets after the -"),
    ("scalesgd--ring", "give its codec after the -"),  # was "--algorithm 'g' is not known"
    ("auto-fp32+fp16@0.01", "@DENSITY sets the density of its sparse exchanges and it has none; topk, "),  # was unused
]


@pytest.mark.parametrize("mode, words", EMPTY_OR_UNUSED, ids=[mode for mode, _ in EMPTY_OR_UNUSED])
def test_a_mode_part_left_empty_or_unused_is_refused(nothing_launches, mode, words):
    assert refused_line(["bench", "train", "--modes", mode]).startswith(
        f"scalesgd: error: --modes {mode}: mode {mode!r}: {words}")


def test_a_density_written_with_an_exponent_is_read(nothing_launches):
    """Was `density '1e' is not a number`: the amount ended at the exponent's sign."""
    assert run_main(["bench", "train", "--modes", "scalesgd-topk@1e-05,scalesgd-topk@1e-3-hierarchical"]) == (
        VALIDATED, "", "")


@pytest.mark.parametrize("argv, flag", [
    (["bench", "train", "--model=--"], "--model"),  # was UnknownName: unknown model ()
    (["train", "--seed=--"], "--seed"),  # was TypeError: '>=' not supported between 'tuple' and 'int'
    (["train", "--run-dir=--"], "--run-dir"),  # validated with run_dir (), which no run can use
])
def test_an_option_given_as_a_lone_double_dash_is_one_line_and_exit_2(nothing_launches, argv, flag):
    """argparse drops the `--` of `--flag=--` and leaves the option an empty list, which no check expects."""
    parser = " ".join(argv[:-1])
    assert refused_line(argv) == f"scalesgd: error: scalesgd {parser}: argument {flag}: expected one argument"


@pytest.mark.parametrize("argv", [
    ["train", "--buckets", "size:1\nscalesgd: error: not this"],
    ["bench", "train", "--modes", "ddp\r\nx"],
    ["train", "--compress-after", "2ep\x1b[2K\u2028"],
])
def test_a_line_break_typed_into_a_value_stays_on_the_one_error_line(nothing_launches, argv):
    """A value typed as $'a\\nb' was shown as is: the error took two lines, the second looking like a message of its
    own."""
    line = refused_line(argv)
    assert "\\n" in line or "\\r" in line or "\\x1b" in line, line


# ---- found by the fuzzing, fixed beside their options ------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--codec", "onebit", "--optimizer", "onebit-adam", "--compress-after", "1e308ep"],
    ["--optimizer", "adamw", "--freeze-variance", "--compress-after", "1e308ep"],
    ["--engine", "scalesgd", "--codec", "topk", "--compress-after", "1e308ep"],
], ids=["onebit-adam", "freeze-variance", "topk"])
def test_compression_after_more_epochs_than_a_float_holds_is_refused_or_usable(nothing_launches, argv):
    code, out, err = run_main(["train", *argv])
    if code == EXIT_USAGE:
        assert err.startswith("scalesgd: error: --compress-after 1e308ep") and one_line(err[:-1]), err
        return
    assert (code, out, err) == (VALIDATED, "", "")
    TrainConfig.from_argv(argv).compress_after_steps(10)  # what every worker computes first


@pytest.mark.parametrize("mode", ["auto", "auto-fp32+fp16+bf16+fp8+topk@0.01"])
def test_an_auto_mode_validates(nothing_launches, mode):
    assert run_main(["bench", "train", "--modes", mode]) == (VALIDATED, "", "")


@pytest.mark.skipif(not os.path.isdir("/proc/1"), reason="needs Linux's /proc")
def test_a_run_directory_that_cannot_be_made_is_one_line_and_exit_2(monkeypatch, tmp_path):
    from scalesgd.train import command as train_command

    monkeypatch.setattr(cli, "COMMANDS", COMMANDS)  # the real run, up to its workers
    monkeypatch.setattr(train_command.worker, "spawn", lambda *a, **k: pytest.fail("a worker was started"))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["train", "--run-dir", "/proc/1/scalesgd-run"])
    assert code == EXIT_USAGE and err.startswith("scalesgd: error: --run-dir /proc/1/scalesgd-run") and one_line(
        err[:-1]), err
