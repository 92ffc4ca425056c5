"""No import cycles: every `specscale` / `specscale_lab` import (module level or inside a function) read from
the source, between packages (engine, model, search, verify, bench, tasks, ...) and between modules; and the
direction between the two: the serving system (`specscale`) never imports the lab (`specscale_lab`)."""

import ast
from pathlib import Path

import specscale
import specscale_lab

ROOT = Path(specscale.__file__).parent
LAB_ROOT = Path(specscale_lab.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    return imports_in(path.read_text(), modules)


def imports_in(source: str, modules: set[str]) -> set[str]:
    """The specscale / specscale_lab modules a source imports (`from a.b import c` names a.b.c when c is a
    module)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("specscale"):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names} & modules
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("specscale")}
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for root in (ROOT, LAB_ROOT) for p in root.rglob("*.py")}
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
    assert "specscale.runtime.backend" in graph["specscale.runtime.runtime"]


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_no_package_cycles():
    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        package = package_of(module)
        packages.setdefault(package, set()).update(package_of(t) for t in targets if package_of(t) != package)
    for top in ("specscale", "specscale_lab"):  # the __init__.py files
        packages.pop(top, None)
        for targets in packages.values():
            targets.discard(top)
    assert cycles(packages) == []


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def lab_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The system's modules that import the lab, with what they import from it."""
    system = {name: targets for name, targets in graph.items() if is_system(name)}
    found = {name: {t for t in targets if not is_system(t)} for name, targets in system.items()}
    return {name: targets for name, targets in found.items() if targets}


def is_system(module: str) -> bool:
    return module == "specscale" or module.startswith("specscale.")


def test_the_system_never_imports_the_lab():
    graph = import_graph()
    assert "specscale_lab.bench" in graph["specscale_lab.commands"]  # the walk sees the lab too
    assert lab_imports(graph) == {}


def test_a_lab_import_in_the_system_is_found():
    planted = "import os\n\ndef f():\n    from specscale_lab.tasks.toy import toy_problems\n    import specscale_lab.bench\n"
    modules: set[str] = set()
    graph = {"specscale.cli": imports_in(planted, modules), "specscale_lab.commands": {"specscale.cli"}}
    assert lab_imports(graph) == {"specscale.cli": {"specscale_lab.tasks.toy", "specscale_lab.bench"}}


def test_the_seam_is_a_leaf_that_every_side_imports():
    """`specscale/seam/` (the values crossing the backend seam) imports nothing of specscale outside itself, so
    the engine, the verifier, the search, the simulator and the scale-out layer may all import it."""
    graph = import_graph()
    seam = {name: targets for name, targets in graph.items() if name.startswith("specscale.seam")}
    assert seam and all(t.startswith("specscale.seam") for targets in seam.values() for t in targets)
    importers = {package_of(name) for name, targets in graph.items()
                 if any(t.startswith("specscale.seam") for t in targets) and not name.startswith("specscale.seam")}
    assert {"specscale.engine", "specscale.verify", "specscale.runtime", "specscale.scaleout"} <= importers


def simulator_importers(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The system's modules outside the simulator that import it (the lab may: it drives simulations)."""
    found = {name: {t for t in targets if t.startswith("specscale.sim")} for name, targets in graph.items()
             if is_system(name) and not name.startswith("specscale.sim")}
    return {name: targets for name, targets in found.items() if targets}


def test_the_serving_path_never_enters_the_simulator():
    """cli -> serve -> server -> runtime -> search -> engine -> model, and the pipeline beside them, import no
    module of `specscale/sim/`: the device cost models they need live in `specscale/costmodel/`."""
    graph = import_graph()
    assert "specscale.costmodel.row_budget" in graph["specscale.pipeline"]  # the walk sees the cost models
    assert simulator_importers(graph) == {}


def test_a_simulator_import_in_the_serving_path_is_found():
    graph = {"specscale.pipeline": {"specscale.sim.cost"}, "specscale.sim.simulation": {"specscale.stack"},
             "specscale_lab.simulate": {"specscale.sim.simulation"}}
    assert simulator_importers(graph) == {"specscale.pipeline": {"specscale.sim.cost"}}
