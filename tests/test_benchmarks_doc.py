"""The benchmark report stays one a reader can take in (issue 28, point 4): docs/bench, the committed run
folders, stays under 3 MB (raw per-request dumps are written by the commands but not committed), and every
`docs/bench/...` path the docs name exists, so a table's run folder can be opened. A placeholder in a path
(`<run>`, `<sub-command>`, an upper-case word such as FIT or HARDWARE, a glob) stands for any folder: the
part before it must exist. docs/BENCHMARKS.md is an index of one screen; the benchmark pages it lists sit
directly in docs/bench, and their relative links (run folders, other pages and their sections) resolve."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "docs" / "bench"
LIMIT_BYTES = 3_000_000
PATH = re.compile(r"docs/bench(?:/[^\s`'\"()\[\],;|]*)?")
PLACEHOLDER = re.compile(r"[<>{}*?]|^[A-Z][A-Z0-9_-]*(?:\.\w+)?$")
LINK = re.compile(r"\]\((bench/[^)\s#]+)(?:#[^)\s]*)?\)")  # a Markdown link or image relative to docs/, e.g. ](bench/soak/soak.png)
RELATIVE = re.compile(r"\]\(([^)\s:#]*)(?:#([^)\s]*))?\)")  # a relative link's path and section: ](sim/a100-7b-work/), ](x.md#y)
INDEX = ROOT / "docs" / "BENCHMARKS.md"


def pages() -> list[Path]:
    """The benchmark pages: the docs/bench/*.md files docs/BENCHMARKS.md links to (not a command's own output
    such as docs/bench/profile-prm.md)."""
    return sorted({BENCH / name for name in re.findall(r"\]\(bench/([^/)#\s]+\.md)", INDEX.read_text())})


def docs() -> list[Path]:
    """README.md, every page under docs/ and the benchmark pages, but not the run folders' own tables (they
    record their commands as run, `--out /tmp/...` included)."""
    return ([ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if BENCH not in p.parents)
            + pages())


def slug(heading: str) -> str:
    """The anchor a Markdown heading gets (GitHub's rule: lower case, punctuation dropped, spaces to hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            headings.add(slug(line))
    return headings


def broken_links(page: Path) -> list[str]:
    """The relative links of a page whose file or section does not exist."""
    broken = []
    for path, section in RELATIVE.findall(page.read_text()):
        target = page.parent / path if path else page
        if not target.exists() or (section and target.suffix == ".md" and section not in anchors(target)):
            broken.append(f"{path}#{section}" if section else path)
    return broken


def committed_files() -> list[Path]:
    """What git would commit under docs/bench (tracked, or untracked and not ignored); every file when this is
    not a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                                 "docs/bench"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in BENCH.rglob("*") if p.is_file()]
    return [ROOT / name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def checked_part(path: str) -> str:
    """The path up to its first placeholder component."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if PLACEHOLDER.search(part):
            return "/".join(parts[:i])
    return path


def named_paths(text: str) -> set[str]:
    """`docs/bench/...` as written, and the docs' relative links into bench/ under their docs/ spelling."""
    return {match.rstrip(".:") for match in PATH.findall(text)} | {"docs/" + link for link in LINK.findall(text)}


def missing(text: str) -> list[str]:
    return sorted(path for path in named_paths(text) if not (ROOT / checked_part(path)).exists())


def test_docs_bench_is_under_3_mb():
    """The run folders, that is; the benchmark pages are the report's text (docs/BENCHMARKS.md before its split)."""
    text = set(pages())
    sizes = {p.relative_to(ROOT).as_posix(): p.stat().st_size for p in committed_files() if p not in text}
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert sum(sizes.values()) < LIMIT_BYTES, f"docs/bench holds {sum(sizes.values()):,} bytes; largest {largest}"


def test_every_docs_bench_path_named_exists():
    dangling = {doc.relative_to(ROOT).as_posix(): missing(doc.read_text()) for doc in docs()}
    assert {doc: paths for doc, paths in dangling.items() if paths} == {}


def test_benchmarks_md_is_a_one_screen_index_of_the_pages():
    listed = pages()
    assert len(INDEX.read_text().splitlines()) <= 60
    assert len(listed) >= 10 and all(page.is_file() for page in listed)
    assert {page: broken_links(page) for page in [INDEX] + listed if broken_links(page)} == {}


def test_the_link_check_sees_a_missing_file_or_section(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "b.md").write_text("# A page\n\n## Where the time goes, and why (`x`)\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text("[r](run/) [b](b.md#where-the-time-goes-and-why-x) [gone](gone/) [b](b.md#not-a-heading) "
                    "[self](#a-page) [web](https://example.com/x)")
    assert anchors(tmp_path / "b.md") == {"a-page", "where-the-time-goes-and-why-x"}
    assert broken_links(page) == ["gone/", "b.md#not-a-heading", "#a-page"]


def test_the_check_reads_placeholders_and_sees_a_dangling_path():
    text = ("`docs/bench/<sub-command>/`, docs/bench/sim-validation/FIT/ladder, `docs/bench/sim/<run>/`, "
            "(`docs/bench/profile-prm.md`). `docs/bench/no-such-run/summary.json`, docs/bench/sim/a100-7b-perfect-0.1-controls "
            "![soak](bench/soak/soak.png) ![gone](bench/gone.png)")
    assert named_paths(text) >= {"docs/bench/profile-prm.md", "docs/bench/sim/a100-7b-perfect-0.1-controls",
                                 "docs/bench/soak/soak.png"}
    assert checked_part("docs/bench/sim-validation/FIT/ladder") == "docs/bench/sim-validation"
    assert checked_part("docs/bench/sim/<run>/") == "docs/bench/sim"
    assert missing(text) == ["docs/bench/gone.png", "docs/bench/no-such-run/summary.json"]
