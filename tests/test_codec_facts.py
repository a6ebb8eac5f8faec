"""A codec's facts live in its registration: no module outside `comm/codecs/` branches on a codec's name, read from
the package's source with `ast` (a comparison or a `startswith` against a registered codec's name as a literal).

Precision names coincide with the cast codecs' (fp32, fp16, bf16), so a comparison whose other side is a precision
or a dtype is not a codec branch."""

import ast
from pathlib import Path

import scalesgd
from scalesgd.comm.codecs import CODECS, CodecSettings, make_codec
from scalesgd.comm.codecs.fp8.codec import Fp8Codec

PACKAGE = Path(scalesgd.__file__).parent
CODECS_DIR = PACKAGE / "comm" / "codecs"
NOT_CODECS = ("precision", "dtype")  # what else is named fp32, fp16 or bf16


def literals(node: ast.AST) -> list[str]:
    """The string constants of a node: itself, or the elements of a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for element in node.elts for value in literals(element)]
    return []


def names_branched_on(tree: ast.AST, source: str) -> list[tuple[int, str]]:
    """(line, codec name) of each comparison or prefix test against a codec's name as a literal."""
    codecs, found = set(CODECS), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith"):
            operands = [node.func.value, *node.args]
        else:
            continue
        texts = " ".join(ast.get_source_segment(source, o) or "" for o in operands)
        if any(word in texts for word in NOT_CODECS):
            continue
        hits = [value for o in operands for value in literals(o)
                if value in codecs or any(value.startswith(c) for c in codecs)]
        found += [(node.lineno, hit) for hit in hits]
    return found


def test_no_module_outside_the_codecs_branches_on_a_codec_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if CODECS_DIR in path.parents:
            continue
        source = path.read_text()
        found += [f"{path.relative_to(PACKAGE)}:{line}: {name!r}"
                  for line, name in names_branched_on(ast.parse(source), source)]
    assert not found, "codec names branched on outside comm/codecs/ (declare the fact in the registration):\n" + \
        "\n".join(found)


def test_the_check_finds_a_branch_on_a_name():
    source = 'if codec == "onebit" or mode.codec in ("lowrank", "powersgd") or name.startswith(("topk", "x")):\n  pass'
    assert [name for _, name in names_branched_on(ast.parse(source), source)] == ["onebit", "lowrank", "powersgd",
                                                                                  "topk"]
    precision = 'if cfg.precision == "fp16":\n  pass'
    assert names_branched_on(ast.parse(precision), precision) == []


def test_whether_a_codec_needs_the_node_groups_is_declared_once_in_its_registration():
    from scalesgd.comm.codecs.base import Codec

    def subclasses(cls):
        return [cls, *(c for sub in cls.__subclasses__() for c in subclasses(sub))]

    declaring = [cls.__name__ for cls in subclasses(Codec) if "needs_topology" in vars(cls)]
    assert declaring == [], "needs_topology belongs to the registration (CodecEntry), not the codec class"
    assert {name for name, entry in CODECS.items() if entry.needs_topology} == {"fp8", "fp8-direct", "topk-nodes"}


def test_a_registration_says_whether_its_codec_carries_gradients_across_steps():
    built = {name: make_codec(name, CodecSettings()).keeps_gradients for name, entry in CODECS.items()
             if entry.build is not None and name != "fp8"}  # fp8 builds its kernels (seconds): it carries none
    assert built == {name: CODECS[name].keeps_gradients for name in built}
    assert CODECS["fp8"].keeps_gradients == Fp8Codec.keeps_gradients


def test_a_registration_says_whether_a_worker_may_join_its_exchange_mid_run():
    built = {name: make_codec(name, CodecSettings()).shared_state_dict() is not None for name, entry in CODECS.items()
             if entry.build is not None and name != "fp8"}
    assert built == {name: CODECS[name].joinable for name in built} and not CODECS["onebit"].joinable
