"""docs/ARCHITECTURE.md names only what exists: every file or folder path it quotes is in the repository or the
package, and every `path.py:name` is defined in that file."""

import ast
import re
from pathlib import Path

import scalesgd

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(scalesgd.__file__).parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
QUOTED = re.compile(r"`([^`\s]+)`")


def named_paths(text: str) -> list[str]:
    """The quoted tokens that are paths: a folder (ending in /) or a Python or Markdown file, optionally
    `:name`."""
    return [token for token in QUOTED.findall(text)
            if re.fullmatch(r"[\w./-]+/|[\w./-]+\.(py|md)(:\w+(\.\w+)?)?", token)]


def exists(path: str) -> bool:
    return any((base / path).exists() for base in (ROOT, PACKAGE))


def defines(path: str, name: str) -> bool:
    """Whether the module at `path` defines `name` (a class, a function, or a method as Class.method)."""
    file = next(base / path for base in (ROOT, PACKAGE) if (base / path).exists())
    tree = ast.parse(file.read_text())
    scopes = [tree]
    for part in name.split("."):
        found = [node for scope in scopes for node in getattr(scope, "body", [])
                 if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == part]
        if not found:
            return False
        scopes = found
    return True


def test_every_path_the_architecture_names_exists():
    missing = []
    for token in named_paths(DOC.read_text()):
        path, _, name = token.partition(":")
        if not exists(path):
            missing.append(token)
        elif name and not defines(path, name):
            missing.append(token)
    assert missing == [], f"docs/ARCHITECTURE.md names what is not there: {missing}"


def test_the_check_reads_paths_and_refuses_what_is_missing():
    text = "`train/loop.py:train_epoch` and `comm/` and `--flags` and `nothing/here.py` and `train/loop.py:nope`"
    assert named_paths(text) == ["train/loop.py:train_epoch", "comm/", "nothing/here.py", "train/loop.py:nope"]
    assert exists("comm/") and exists("train/loop.py") and not exists("nothing/here.py")
    assert defines("train/loop.py", "train_epoch") and not defines("train/loop.py", "nope")
