"""The README's own examples, run as a newcomer would run them, on the bundled toy models (issue 17).

Every toy question the README shows (``--question "..."``, ``--prompt "..."``) goes through
``specscale solve`` under the README's stated seed (solve's default, ``--seed 0``); its ``specscale solve``
lines run exactly as written. The serving section's curl body is posted to a real ``specscale serve``
and its ``openai`` snippet is executed against it. Each must come back with the true answer, which the
test reads off the question with the toy task's own sentence patterns (``docs/toy-models.md``). The
examples are parsed from README.md, so a new example is covered without touching this file.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shlex
import sys
from pathlib import Path

import httpx
import pytest

from server_process import serving
from specscale.cli import main as specscale_main
from specscale_lab.tasks.toy import MAX_OPS, MIN_OPS, extract_answer, toy_problems

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
QUESTION_FLAG = re.compile(r'--(?:question|prompt) "([^"]+)"')
SOLVE_LINE = re.compile(r"^specscale solve .*--question .*$", re.MULTILINE)
CURL_BODY = re.compile(r"^curl .*?-d '(\{.*?\})'", re.MULTILINE | re.DOTALL)
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)

START = re.compile(r"^(\w+) has (\d+) (\w+)\.")
EVENTS = (  # (sentence pattern after the name, how it changes the total), as the task words its events
    (re.compile(r"(?:finds|buys) (\d+) more\.|gets (\d+) more from \w+\."), lambda value, b: value + b),
    (re.compile(r"gives (\d+) to \w+\.|loses (\d+)\.|sells (\d+)\."), lambda value, b: value - b),
    (re.compile(r"doubles the \w+\."), lambda value, b: value * 2),
    (re.compile(r"triples the \w+\."), lambda value, b: value * 3),
    (re.compile(r"gives half of the \w+ to \w+\."), lambda value, b: value // 2),
)


def true_answer(question: str) -> str:
    """The answer of a toy question, computed from its sentences."""
    start = START.match(question)
    assert start, f"not a toy question: {question!r}"
    name, value = start[1], int(start[2])
    body = question[start.end():question.index(" How many")]
    for sentence in re.findall(rf"{name} ([^.]*\.)", body):
        value = apply_sentence(sentence, value)
    return str(value)


def apply_sentence(sentence: str, value: int) -> int:
    for pattern, change in EVENTS:
        match = pattern.fullmatch(sentence)
        if match:
            operand = next((int(g) for g in match.groups() if g is not None), 0)
            return change(value, operand)
    raise AssertionError(f"not a toy event: {sentence!r}")


def solve_lines() -> list[str]:
    return SOLVE_LINE.findall(README)


def other_questions() -> list[str]:
    """The README's questions that no ``specscale solve`` line of it runs (e.g. the ``generate`` one)."""
    solved = {q for line in solve_lines() for q in QUESTION_FLAG.findall(line)}
    return [q for q in dict.fromkeys(QUESTION_FLAG.findall(README)) if q not in solved]


def run_solve(argv: list[str]) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert specscale_main(argv) == 0
    return out.getvalue(), err.getvalue()


def answers_printed(stdout: str) -> list[str]:
    return re.findall(r"^answer: (\S+)", stdout, re.MULTILINE)


def test_the_answer_reader_agrees_with_the_task():
    problems = toy_problems("train", 300, seed=5)
    assert {len(p.ops) for p in problems} == set(range(MIN_OPS, MAX_OPS + 1))
    for problem in problems:
        assert true_answer(problem.question) == problem.answer, problem.question


def test_the_readme_has_examples_to_check():
    assert solve_lines() and other_questions() and CURL_BODY.search(README)


@pytest.mark.parametrize("line", solve_lines())
def test_each_readme_solve_line_answers_its_question(line):
    argv = shlex.split(line)[1:]
    questions = QUESTION_FLAG.findall(line)
    stdout, _ = run_solve(argv)
    assert answers_printed(stdout) == [true_answer(q) for q in questions], stdout


@pytest.mark.parametrize("question", other_questions())
def test_each_other_readme_question_is_answered_by_solve(question):
    stdout, stderr = run_solve(["solve", "--question", question, "--quiet"])
    assert answers_printed(stdout) == [true_answer(question)], stdout
    assert "searches" not in stderr  # no progress bar off a terminal


# ---- serving ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    log = tmp_path_factory.mktemp("readme-server") / "server.log"
    command = [sys.executable, "-m", "specscale.cli", "serve", "--port", "0", "--log-level", "warning"]
    with serving(command, log, start_timeout_s=180.0) as server:
        yield server.url


def test_the_readme_curl_example_gets_the_true_answer(server_url):
    body = json.loads(CURL_BODY.search(README)[1])
    question = body["messages"][-1]["content"]
    response = httpx.post(f"{server_url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer = response.json()["search"]["answer"]
    assert answer == true_answer(question), response.text


def chat_messages(code: str) -> list[dict]:
    """The literal ``messages=`` of the chat completion call in ``code``."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.keyword) and node.arg == "messages":
            return ast.literal_eval(node.value)
    raise AssertionError("no messages= in the openai example")


def test_the_readme_openai_example_streams_the_true_answer(server_url):
    code = next(block for block in PYTHON_BLOCK.findall(README) if "from openai import OpenAI" in block)
    code = code.replace("http://localhost:8000/v1", f"{server_url}/v1")
    question = chat_messages(code)[-1]["content"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    assert "round" in printed.getvalue()  # the progress chunks arrived
    assert extract_answer(printed.getvalue()) == true_answer(question), printed.getvalue()
