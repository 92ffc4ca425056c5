"""The toy task: problems, splits, the step checker, answer extraction, solutions and corruptions."""

import random
import re
import statistics
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specscale_lab.tasks.toy import (
    EVENT_WEIGHTS,
    MAX_OPS,
    MAX_VALUE,
    MIN_OPS,
    Op,
    ToyProblem,
    extract_answer,
    first_error,
    is_correct,
    label_steps,
    split_of,
    split_steps,
    toy_problems,
)
from specscale_lab.tasks.toy_corrupt import corrupt_steps, wrong_number
from specscale_lab.tasks.toy_solutions import NO_SLIPS, SlipRates, needs_carry, render_solution, slipped_result


def _problem() -> ToyProblem:
    """Mia has 11 apples, gives 6 to Leo, finds 4 more, doubles them: 11 - 6 = 5, 5 + 4 = 9, 9 * 2 = 18."""
    ops = (
        Op("sub", 6, "Mia gives 6 to Leo."),
        Op("add", 4, "Mia finds 4 more."),
        Op("mul", 2, "Mia doubles the apples."),
    )
    question = "Mia has 11 apples. " + " ".join(op.sentence for op in ops) + " How many apples does Mia have now?"
    return ToyProblem(question, "18", "Mia", "apples", 11, ops)


GOOD = [
    "Mia gives 6 to Leo, so 11 - 6 = 5.",
    "Mia finds 4 more. Now Mia has 5 + 4 = 9 apples. Check: 9 - 4 = 5.",
    "9 * 2 = 18.",
    "The answer is \\boxed{18}.",
]


def test_good_solution_is_all_good():
    assert label_steps(_problem(), GOOD) == [True] * 4
    assert is_correct(_problem(), "\n\n".join(GOOD))


@pytest.mark.parametrize(
    "first_step",
    [
        "11 - 6 = 7.",  # wrong result
        "11 - 4 = 7.",  # wrong operand (arithmetic right)
        "11 + 6 = 17.",  # wrong operation (arithmetic right)
        "12 - 6 = 6.",  # wrong running total
        "5 + 4 = 9.",  # skips an event
        "Mia gives 6 to Leo, so 11 - 6 = 5. Check: 5 + 6 = 12.",  # wrong check
        "Mia gives 7 to Leo, so 11 - 6 = 5.",  # a number that is not in the problem
        "",  # empty step
    ],
)
def test_bad_first_step_makes_every_step_bad(first_step):
    assert label_steps(_problem(), [first_step, *GOOD[1:]]) == [False] * 4


def test_labels_depend_on_the_step_not_only_the_problem():
    problem = _problem()
    assert label_steps(problem, ["11 - 6 = 5."]) == [True]
    assert label_steps(problem, ["11 - 6 = 7."]) == [False]
    assert label_steps(problem, [*GOOD[:2], "9 * 2 = 19."]) == [True, True, False]
    assert label_steps(problem, [*GOOD[:3], "The answer is \\boxed{17}."]) == [True, True, True, False]


@pytest.mark.parametrize(
    ("first_step", "error_starts"),
    [
        ("11 - 6 = 7.", "7."),  # the wrong digit
        ("11 - 6 = 55.", "5."),  # a digit too many
        ("11 - 4 = 7.", "4 = 7."),  # the wrong operand
        ("11 + 6 = 17.", "+ 6"),  # the wrong operation
        ("12 - 6 = 6.", "2 - 6"),  # the wrong running total, from its first wrong digit
        ("Mia gives 7 to Leo, so 11 - 6 = 5.", "7 to Leo"),  # an unknown number
        ("11 - 6 = 5. Check: 5 + 6 = 12.", "2."),  # a wrong check
    ],
)
def test_first_error_points_at_the_first_wrong_character(first_step, error_starts):
    step_index, offset = first_error(_problem(), [first_step, *GOOD[1:]])
    assert step_index == 0
    assert first_step[offset:].startswith(error_starts)


def test_first_error_in_later_steps_and_none_for_good_solutions():
    assert first_error(_problem(), GOOD) is None
    wrong_box = [*GOOD[:3], "The answer is \\boxed{17}."]
    assert first_error(_problem(), wrong_box) == (3, wrong_box[3].index("7}"))
    assert first_error(_problem(), [*GOOD[:2], ""]) == (2, 0)


def test_restating_and_commutative_steps_are_good():
    steps = ["Mia starts with 11 apples.", "11 - 6 = 5.", "4 + 5 = 9.", "2 * 9 = 18. \\boxed{18}"]
    assert label_steps(_problem(), steps) == [True] * 4


def test_extract_answer_and_is_correct():
    assert extract_answer("so \\boxed{3} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert extract_answer("no box here") is None
    assert extract_answer("\\boxed{12") is None
    assert is_correct(_problem(), "Therefore, the final answer is: $\\boxed{18}$. I hope it is correct.")
    assert not is_correct(_problem(), "\\boxed{19}")
    assert not is_correct(_problem(), "18")


def test_split_steps_drops_empty_pieces():
    assert split_steps("a\n\nb\n\n") == ["a", "b"]
    assert split_steps("\n\n a \n\n\n\nb") == ["a", "b"]


def test_splits_are_reproducible_and_disjoint():
    test = toy_problems("test", 300, seed=0)
    assert test == toy_problems("test", 300, seed=0)
    assert test != toy_problems("test", 300, seed=1)
    train = toy_problems("train", 3000, seed=0)
    assert not {p.question for p in test} & {p.question for p in train}
    assert all(split_of(p.question) == "test" for p in test)
    assert all(split_of(p.question) == "train" for p in train)
    assert len({p.question for p in test}) == 300
    with pytest.raises(ValueError):
        toy_problems("dev", 1, seed=0)


def test_problems_are_well_formed():
    for problem in toy_problems("train", 500, seed=3):
        assert MIN_OPS <= len(problem.ops) <= MAX_OPS
        assert all(0 <= v <= MAX_VALUE for v in problem.values)
        assert problem.answer == str(problem.values[-1])
        assert all(op.sentence in problem.question for op in problem.ops)


def test_problems_follow_the_event_weights_in_both_splits():
    """Every count in MIN_OPS..MAX_OPS occurs in both splits, each about as often as EVENT_WEIGHTS says
    (docs/toy-models.md, "The task")."""
    total = sum(EVENT_WEIGHTS.values())
    for split in ("train", "test"):
        counts = Counter(len(p.ops) for p in toy_problems(split, 1400, seed=0))
        assert set(counts) == set(range(MIN_OPS, MAX_OPS + 1)) == set(EVENT_WEIGHTS)
        for events, weight in EVENT_WEIGHTS.items():
            expected = 1400 * weight / total
            assert abs(counts[events] - expected) < 4 * expected**0.5, (split, events, counts)


def test_wrong_number_is_a_plausible_nonnegative_wrong_value():
    rng = random.Random(0)
    for value in range(0, 3 * MAX_VALUE):
        drawn = [wrong_number(value, rng) for _ in range(30)]
        assert all(v != value and v >= 0 for v in drawn)
    dropped_carries = sum(wrong_number(25, rng) == 15 for _ in range(3000))
    assert 900 < dropped_carries < 1300  # a third of the time, plus the odd random draw


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_clean_solutions_are_good_and_correct(seed):
    rng = random.Random(seed)
    problem = toy_problems("train", 1, seed)[0]
    text = render_solution(problem, rng, NO_SLIPS)
    assert all(label_steps(problem, split_steps(text)))
    assert is_correct(problem, text)
    assert not text.endswith("\n")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
def test_corrupted_solutions_have_a_bad_step(seed):
    rng = random.Random(seed)
    problem = toy_problems("train", 1, seed)[0]
    steps = split_steps(render_solution(problem, rng, NO_SLIPS))
    corrupted = corrupt_steps(problem, steps, rng)
    labels = label_steps(problem, corrupted)
    assert not all(labels)
    first_bad = labels.index(False)
    assert corrupted[:first_bad] == steps[:first_bad]


def test_slips_are_the_classic_carry_and_borrow_mistakes():
    assert needs_carry("add", 47, 38) and slipped_result("add", 47, 38) == 75
    assert needs_carry("sub", 52, 17) and slipped_result("sub", 52, 17) == 45
    assert needs_carry("mul", 27, 2) and slipped_result("mul", 27, 2) == 44
    assert needs_carry("div", 34, 2) and slipped_result("div", 34, 2) == 12
    assert not needs_carry("add", 41, 38)


def test_slipping_student_makes_mistakes_the_checker_sees():
    rng = random.Random(0)
    problems = toy_problems("train", 400, seed=5)
    texts = [render_solution(p, rng, SlipRates(hard=0.5)) for p in problems]
    accuracy = statistics.mean(is_correct(p, t) for p, t in zip(problems, texts, strict=True))
    assert 0.2 < accuracy < 0.8
    for problem, text in zip(problems, texts, strict=True):
        if all(label_steps(problem, split_steps(text))):
            assert is_correct(problem, text)


def test_step_lengths_vary_like_reasoning():
    rng = random.Random(1)
    lengths = [
        len(step)
        for problem in toy_problems("train", 200, seed=2)
        for step in split_steps(render_solution(problem, rng))
    ]
    assert statistics.pstdev(lengths) / statistics.mean(lengths) > 0.4
    assert min(lengths) < 20 < 80 < max(lengths)


def test_every_event_step_opens_with_its_event():
    """A step restates the event it applies, so the next step (and a verifier) can find its place in the
    story by reading the sentence after the one just restated, without counting steps."""
    rng = random.Random(3)
    for problem in toy_problems("train", 200, seed=4):
        steps = split_steps(render_solution(problem, rng, NO_SLIPS))
        event_steps = [step for step in steps if re.search(r"\d+ [-+*/] \d+ = \d+", step)]
        assert len(event_steps) == len(problem.ops)
        for step, op in zip(event_steps, problem.ops, strict=True):
            assert step.startswith(op.sentence[:-1]), (step, op.sentence)
