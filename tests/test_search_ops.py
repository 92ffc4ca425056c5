"""The search and its policies meet at one typed interface (`search/ops.py`'s `SearchOps`): no policy, and
nothing else outside `search/search.py`, calls a private (`_`-prefixed) member of a `Search`."""

import ast
from pathlib import Path

import specscale

ROOT = Path(specscale.__file__).parent
CHECKED = sorted((ROOT / "search").glob("*.py")) + sorted((ROOT / "runtime").glob("*.py"))


def private_search_members(source: str) -> list[str]:
    """`search._x` or `<anything>.search._x` (a dunder aside), as written in source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value
        named_search = (isinstance(owner, ast.Name) and owner.id == "search") or (
            isinstance(owner, ast.Attribute) and owner.attr == "search")
        if named_search:
            found.append(ast.unparse(node))
    return found


def test_no_policy_reaches_into_the_search():
    offenders = {path.name: private_search_members(path.read_text())
                 for path in CHECKED if path.name != "search.py"}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_a_private_call_is_found():
    source = "def hook(search, state):\n    search._expand(1)\n    state.search._verify(2)\n    search.__class__\n"
    assert private_search_members(source) == ["search._expand", "state.search._verify"]


def test_search_implements_the_operations_its_policies_call():
    from specscale.search.ops import SearchOps
    from specscale.search.presets import preset_config
    from specscale.search.search import Search

    search = Search(preset_config("beam"))
    operations = [name for name in vars(SearchOps) if not name.startswith("_")]
    assert operations and all(hasattr(search, name) for name in operations)
