"""The package's layers, read from its source with `ast`: no circle of imports, nothing imports a layer above
its own, and imports sit at the top of modules except an optional heavy dependency's, commented."""

import ast
from pathlib import Path

import scalesgd

PACKAGE = Path(scalesgd.__file__).parent

# Each part of the package and its layer: a module imports only from lower layers or its own part. The parts are
# the top-level modules and packages, and the gradient exchange's own concerns inside `comm`, bottom up: the wire,
# the codecs, the engines that drive them, the cost model that measures and plans them.
LAYERS = {
    "errors": 0, "registry": 0, "checks": 0, "trace": 0, "output": 0, "units": 0,
    "options": 1,
    "models": 2, "data": 2, "optim": 2,
    "recipe": 3, "comm.wire": 3.1, "comm.codecs": 3.2, "comm.engine": 3.3, "comm.cost": 3.4, "comm": 3.5,
    "elastic": 3.55, "periodic": 3.6,
    "config": 4, "runtime": 4,
    "sim": 5, "peers": 5.5,
    "train": 6, "testbed": 6,
    "bench": 7,
    "commands": 8,
    "cli": 9,
    "__main__": 10, "__init__": 10,
}


def module_name(path: Path) -> str:
    parts = ("scalesgd", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def part_of(module: str) -> str:
    """The part a module belongs to (`scalesgd` itself is its __init__; `comm`'s subpackages are parts of their
    own)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "comm" and f"comm.{parts[2]}" in LAYERS:
        return f"comm.{parts[2]}"
    return parts[1] if len(parts) > 1 else "__init__"


def project_imports(module: str) -> list[tuple[str, ast.stmt]]:
    """(imported project module, statement) for every import in `module`'s source, at any depth."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.append((child if child in MODULES else node.module, node))
    return [(target, node) for target, node in found if target.split(".")[0] == "scalesgd"]


def import_graph() -> dict[str, set[str]]:
    return {m: {target for target, _ in project_imports(m) if target != m} for m in MODULES}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_circle_and_a_clean_graph():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_circle_of_imports_between_modules():
    assert circles(import_graph()) == []


def test_every_part_has_a_layer():
    assert {part_of(m) for m in MODULES} == set(LAYERS)


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{m} → {target}" for m in MODULES for target, _ in project_imports(m)
              if part_of(target) != part_of(m) and LAYERS[part_of(target)] >= LAYERS[part_of(m)]]
    assert upward == []


def test_imports_inside_functions_are_only_commented_optional_dependencies():
    found = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        tree = ast.parse(path.read_text())
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    commented = "#" in lines[node.lineno - 1]
                    if any(n.split(".")[0] == "scalesgd" for n in names) or not commented:
                        found.append(f"{module}:{node.lineno} {', '.join(names)}")
    assert found == []
