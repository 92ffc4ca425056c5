"""`specscale solve` output fit for a log (issue 17): the `searches:` bar on a terminal only, and
`--quiet` still prints one answer line per question before the summary. Real bundled toy models, two
held-out problems, a small beam."""

from __future__ import annotations

import contextlib
import io
import re

from specscale.cli import main as specscale_main

ARGS = ["solve", "--problems", "2", "--beam-size", "4", "--beam-width", "2", "--max-rounds", "12"]


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def run(argv: list[str], stderr: io.StringIO) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(stderr):
        assert specscale_main(argv) == 0
    return out.getvalue()


def test_quiet_piped_solve_prints_one_answer_line_per_question_then_the_summary_and_no_bar():
    stderr = io.StringIO()
    stdout = run(ARGS + ["--quiet"], stderr)
    lines = stdout.splitlines()
    assert all(re.fullmatch(r"answer: \S+  \[(correct|wrong; true \d+)\]", line) for line in lines[:2]), stdout
    assert lines[2].startswith("preset specscale: 2 requests") and "###" not in stdout
    assert "searches" not in stderr.getvalue()


def test_the_progress_bar_is_drawn_on_a_terminal():
    stderr = Terminal()
    stdout = run(ARGS, stderr)
    assert "searches" in stderr.getvalue()
    assert stdout.count("### ") == 2
