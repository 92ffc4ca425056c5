"""Grading on real data: answer extraction, gold answers of the bundled data sets, math-verify
equivalence on real MATH-500 gold answers (in a worker process, with a timeout that holds off the main
thread), and the search result's votes grouped by equivalence."""

import json
import os
import random
import signal
import threading
import time

import pytest

from specscale.answers import votes
from specscale.grading import DATASETS, AnswerGrader, extract_answer, load_problems
from specscale.grading.datasets import DATA_DIR
from specscale.grading.worker import KILL_GRACE_S
from specscale.search.result import CompletedPath
from specscale_lab.tasks.toy import extract_answer as toy_extract_answer
from specscale_lab.tasks.toy import toy_problems
from specscale_lab.tasks.toy_solutions import NO_SLIPS, render_solution

MATH500 = [json.loads(line) for line in (DATA_DIR / "math500" / "test.jsonl").open()]


@pytest.fixture(scope="module")
def grader():
    grader = AnswerGrader()
    yield grader
    grader.close()


def run_in_thread(function):
    """function() on a worker thread (as the server's engine thread runs votes); its result."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(value=function()))
    thread.start()
    thread.join()
    return out["value"]


# ---- extraction --------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, answer", [
    ("so \\boxed{\\frac{1}{2}}, then \\boxed{\\frac{\\sqrt{3}}{2}}.", "\\frac{\\sqrt{3}}{2}"),  # the last box
    ("Therefore, the final answer is: $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$. I hope it is correct.",
     "\\left( 3, \\frac{\\pi}{2} \\right)"),  # search-and-learn's closing line
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces pair up
    ("\\fbox{7}", "7"),
    ("so $\\boxed 5$.", "5"),  # no braces: up to the math delimiter
    ("\\boxed 12\nmore text", "12"),  # ... or the end of the line
    ("The answer is 18.", "18"),  # no box: after "answer is"
    ("So the final answer is: $x=2$. I hope it is correct.", "x=2"),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("text", [
    "We add 2 and 3 to get 5.",  # no stated answer: no last-number fallback
    "So the answer is \\boxed{12",  # a truncated box
    "\\boxed{}",
    "",
])
def test_no_answer(text):
    assert extract_answer(text) is None


def test_extraction_reads_every_math500_reference_solution():
    """MATH-500's gold answer is the last box of its reference solution, for all 500."""
    assert [extract_answer(r["solution"]) for r in MATH500] == [r["answer"] for r in MATH500]


def test_extraction_agrees_with_the_toy_task():
    rng = random.Random(3)
    for problem in toy_problems("test", 40, seed=3):
        text = render_solution(problem, rng, NO_SLIPS)
        assert extract_answer(text) == toy_extract_answer(text) == problem.answer
        assert extract_answer(text[:text.rfind("}")]) is None  # cut inside the box


# ---- data sets ---------------------------------------------------------------------------------------
def test_bundled_data_sets():
    sizes = {"math500": 500, "gsm8k": 1319, "olympiadbench": 675}
    for name, size in sizes.items():
        problems = load_problems(name)
        assert len(problems) == size and len({p.problem_id for p in problems}) == size
        assert [p.index for p in problems] == list(range(size))
        assert all(p.question and p.gold and "$" not in p.gold.replace("\\$", "") for p in problems)
        assert (DATA_DIR / name / "LICENSE").is_file() and (DATA_DIR / name / "README.md").is_file()
    assert set(DATASETS) == set(sizes)
    assert load_problems("math500", 2)[1].problem_id == "test/intermediate_algebra/1994.json"
    gsm8k = load_problems("gsm8k")
    assert gsm8k[0].gold == "18" and all(p.gold.lstrip("-").isdigit() for p in gsm8k)  # "1,450,000" -> "1450000"
    olympiad = {p.problem_id: p.gold for p in load_problems("olympiadbench")}
    assert olympiad["olympiadbench/1606"] == "2"
    assert "69,84" in olympiad.values()  # "69$,$84"
    with pytest.raises(ValueError, match="unknown data set"):
        load_problems("math")


# ---- equivalence -------------------------------------------------------------------------------------
EQUIVALENT = [  # (MATH-500 index, its gold answer, another way to write it)
    (2, "\\frac{14}{3}", "14/3"),
    (162, "\\dfrac{17}{50}", "0.34"),
    (0, "\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),  # a tuple
    (435, "(-\\infty, 2) \\cup (3, \\infty)", "(-\\infty,2)\\cup(3,\\infty)"),  # intervals
    (103, "(3,4]", "(3, 4]"),
    (146, "\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}"),  # \sqrt
    (8, "3\\sqrt{13}", "\\sqrt{117}"),
    (31, "11\\sqrt2", "11\\sqrt{2}"),
    (7, "90^\\circ", "90"),  # degrees
    (166, "\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),
    (301, "5.4 \\text{ cents}", "5.4"),  # units
    (467, "15\\mbox{ cm}^2", "15"),
    (242, "\\$32,\\!348", "32348"),
    (4, "\\text{Evelyn}", "Evelyn"),  # text answers
    (227, "\\text{(C)}", "C"),
    (23, "x=5", "5"),
    (454, "y = 2x + 3", "y=3+2x"),
    (36, "3, 5, 7", "7,5,3"),
    (99, "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
     "\\begin{pmatrix} -\\frac13 \\\\ \\frac23 \\\\ \\frac53 \\end{pmatrix}"),  # a matrix
    (228, "288 \\pi", "288\\pi"),
]
DIFFERENT = [
    (103, "(3,4]", "[3,4]"),
    (7, "90^\\circ", "\\frac{\\pi}{2}"),
    (4, "\\text{Evelyn}", "\\text{Navin}"),
    (227, "\\text{(C)}", "\\text{(B)}"),
    (248, "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{pmatrix} -1 & 0 \\\\ 0 & 1 \\end{pmatrix}"),
    (2, "\\frac{14}{3}", "4.67"),
]


@pytest.mark.parametrize("index, gold, answer", EQUIVALENT)
def test_equivalent_answers(grader, index, gold, answer):
    assert MATH500[index]["answer"] == gold
    assert grader.equivalent(gold, answer)


@pytest.mark.parametrize("index, gold, answer", DIFFERENT)
def test_different_answers(grader, index, gold, answer):
    assert MATH500[index]["answer"] == gold
    assert not grader.equivalent(gold, answer)


def test_math_verify_reads_every_math500_gold(grader):
    """Every gold answer that is not a plain number parses and equals itself under math-verify (the
    same-text shortcut bypassed), from a thread that is not the main one."""
    golds = sorted({r["answer"] for r in MATH500 if not r["answer"].lstrip("-").replace(".", "").isdigit()})
    assert len(golds) > 150
    worker = grader._worker
    verdicts = run_in_thread(lambda: [worker.equivalent(gold, gold, 5.0) for gold in golds])
    assert [g for g, ok in zip(golds, verdicts, strict=True) if not ok] == []


def test_plain_numbers_never_reach_math_verify():
    grader = AnswerGrader()
    assert grader.equivalent("1450000", "1,450,000") and grader.equivalent("10,\\!080", "10080")
    assert grader.equivalent("12", "12.0") and grader.equivalent("$-3$", "-3")
    assert not grader.equivalent("18", "-18") and not grader.equivalent("24", "23")
    assert grader.stats.math_verify == 0 and grader._worker.pid is None


def test_a_pathological_answer_times_out_off_the_main_thread(grader):
    """9^(9^9) against 2^(2^40) sends sympy into hours of big-integer work; it counts as different after
    the timeout, and the grader goes on answering."""
    timeouts = grader.stats.timeouts
    start = time.perf_counter()
    assert not run_in_thread(lambda: grader.equivalent("9^{9^{9}}", "2^{2^{40}}", timeout_s=1.0))
    assert time.perf_counter() - start < 1.0 + KILL_GRACE_S + 2.0  # generous: a busy CI machine
    assert grader.stats.timeouts == timeouts + 1
    assert run_in_thread(lambda: grader.equivalent("\\frac{1}{2}", "0.5"))
    calls = grader.stats.math_verify
    assert not grader.equivalent("9^{9^{9}}", "2^{2^{40}}", timeout_s=0.5)  # cached: no longer a timeout than ran out
    assert grader.stats.math_verify == calls


def test_a_stuck_worker_is_killed_and_replaced():
    """A child that does not answer (here: stopped, as one stuck inside a C call would be) is killed
    after the timeout and a fresh one takes the next comparison."""
    grader = AnswerGrader()
    try:
        assert grader.equivalent("\\frac{1}{2}", "1/2")
        os.kill(grader._worker.pid, signal.SIGSTOP)
        start = time.perf_counter()
        assert not grader.equivalent("\\frac{1}{3}", "1/3", timeout_s=0.5)
        assert time.perf_counter() - start < 0.5 + KILL_GRACE_S + 2.0
        assert grader._worker.restarts == 1 and grader.stats.timeouts == 1
        assert grader.equivalent("\\frac{1}{4}", "0.25")
    finally:
        grader.close()


# ---- votes -------------------------------------------------------------------------------------------
def paths(answers_and_scores, copies=None):
    copies = copies or [1] * len(answers_and_scores)
    return [CompletedPath(f"\\boxed{{{a}}}", (f"\\boxed{{{a}}}",), (s,), s, a, 5, c)
            for (a, s), c in zip(answers_and_scores, copies, strict=True)]


def test_votes_group_equivalent_answers(grader):
    """\\frac{1}{2}, 0.5 and 1/2 are one answer (by exact string, "3" would win both votes), named by its
    best-ranked spelling; counted from a thread that is not the main one, as the server does."""
    ranked = paths([("3", 0.9), ("\\frac{1}{2}", 0.5), ("0.5", 0.45), ("1/2", 0.4), (None, 0.99)])
    assert run_in_thread(lambda: votes(ranked, grader)) == ("\\frac{1}{2}", "\\frac{1}{2}")


def test_votes_weight_copies_and_keep_integers_local():
    grader = AnswerGrader()
    ranked = paths([("24", 0.75), ("23", 0.5), ("24.0", 0.25), ("23", 0.25)], copies=[1, 1, 1, 2])
    # weighted: 24 -> 0.75 + 0.25 = 1, 23 -> 0.5 + 2 * 0.25 = 1 (a tie: the best-ranked group); majority: 23 (3 copies)
    assert votes(ranked, grader) == ("24", "23")
    assert votes(paths([(None, 0.5)]), grader) == (None, None) and votes([], grader) == (None, None)
    assert grader.stats.math_verify == 0 and grader._worker.pid is None


def test_votes_from_many_threads(grader):
    ranked = paths([("\\frac{2}{4}", 0.6), ("7", 0.7), ("0.5", 0.6), ("\\sqrt{49}", 0.1)])
    results = []
    threads = [threading.Thread(target=lambda: results.append(votes(ranked, grader))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [("\\frac{2}{4}", "\\frac{2}{4}")] * 4
