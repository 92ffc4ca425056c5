"""docs/architecture.md names every module of the serving system (`specscale/`, by its path under it) and of the
lab (`specscale_lab/...`), and every module path it names exists: the page is where a newcomer learns where
things live, so a module added, moved or removed shows up here (issue 28, point 5)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"(?<![\w/.])((?:[\w.]+/)*\w+\.py)\b")


def named(text: str, path: str) -> bool:
    return re.search(r"(?<![\w/.])" + re.escape(path) + r"(?!\w)", text) is not None


def modules() -> list[str]:
    """Every module but package __init__ files: system ones by their path under specscale/, lab ones in full."""
    found = [p.relative_to(ROOT / "specscale").as_posix() for p in (ROOT / "specscale").rglob("*.py")]
    found += [p.relative_to(ROOT).as_posix() for p in (ROOT / "specscale_lab").rglob("*.py")]
    return sorted(m for m in found if not m.endswith("__init__.py"))


def test_every_module_is_named():
    text = DOC.read_text()
    assert [m for m in modules() if not (named(text, m) or named(text, "specscale/" + m))] == []


def test_every_module_path_named_exists():
    """A path is read under the repository, specscale/ or tests/ (where the scripted backends live)."""
    text = DOC.read_text()
    stale = [path for path in sorted(set(PATH.findall(text)))
             if not any((base / path).is_file() for base in (ROOT, ROOT / "specscale", ROOT / "tests"))]
    assert stale == []


def test_the_check_sees_a_missing_and_a_stale_module():
    text = "`search/search.py` and `specscale_lab/bench/common.py`; `search/gone.py`"
    assert named(text, "search/search.py") and not named(text, "search/tree.py")
    assert not named(text, "search.py")  # a bare file name does not count for a path
    assert "search/gone.py" in PATH.findall(text)


def package_map(text: str) -> str:
    """The package map: the page's first table, under "## The package map"."""
    start = text.index("## The package map")
    return text[start:text.index("\n## ", start + 1)]


def test_the_package_map_names_every_package_and_top_level_module():
    """Each package of `specscale/` (a folder with an `__init__.py`) and each module beside them has a row."""
    rows = package_map(DOC.read_text())
    root = ROOT / "specscale"
    packages = [p.name + "/" for p in root.iterdir() if (p / "__init__.py").is_file()]
    modules = [p.name for p in root.glob("*.py") if p.name != "__init__.py"]
    assert [name for name in sorted(packages + modules) if f"`{name}`" not in rows] == []
