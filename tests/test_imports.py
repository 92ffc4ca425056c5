"""No import cycles: every `specscale` import (module level or inside a function) read from the source,
between packages (engine, model, search, verify, tasks, ...) and between modules."""

import ast
from pathlib import Path

import specscale

ROOT = Path(specscale.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The specscale modules a file imports (`from a.b import c` names a.b.c when c is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("specscale"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names} & modules
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("specscale.")}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(paths)
    return {name: imports_of(path, modules) - {name} for name, path in paths.items()}


def package_of(module: str) -> str:
    """specscale.engine.engine -> specscale.engine; top-level modules are their own package."""
    return ".".join(module.split(".")[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_the_imports():
    graph = import_graph()
    assert "specscale.engine.engine" in graph["specscale.verify.prm"]
    assert "specscale.search.backend" in graph["specscale.search.runtime"]


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_no_package_cycles():
    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        package = package_of(module)
        packages.setdefault(package, set()).update(package_of(t) for t in targets if package_of(t) != package)
    packages.pop("specscale", None)  # specscale/__init__.py
    for targets in packages.values():
        targets.discard("specscale")
    assert cycles(packages) == []


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
