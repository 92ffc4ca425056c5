"""Reference solutions of toy problems, written by a fallible student in varied styles.

``render_solution(problem, rng, slips) -> str`` writes one solution: an optional opening step, one step
per event of the story, and a final step that boxes the result (sometimes merged into the last event's
step). Every event step opens with its event, read from the question (``Mia finds 8 more``), then picks
a style at random, from terse (``Mia finds 8 more: 13 + 8 = 21.``) to one that recalls the total and
checks its work, so step lengths vary the way real reasoning does. Opening with the event is how a
careful reasoner keeps its place in the story: the next step reads the sentence after the one just
restated, and a verifier can check a step against the question without counting steps.

The student slips like people do, and the toy generator learns to slip the same way, so it makes
systematic, difficulty-dependent mistakes that a verifier can catch and a majority vote cannot fix:

- ``hard``: on an operation that needs a carry or a borrow, drop it (47 + 38 = 75, 52 - 17 = 45,
  27 * 2 = 44, 34 / 2 = 12);
- ``easy``: on any other operation, be off by one;
- ``misread``: take the number of another event of the story (reading the wrong line).

A slip is only made when the rest of the story stays within 0..MAX_VALUE with exact halving; the
later steps then compute correctly from the wrong value.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from specscale.prompts import STEP_SEPARATOR
from specscale_lab.tasks.toy_core import MAX_VALUE, Op, ToyProblem, apply_op


@dataclass(frozen=True)
class SlipRates:
    """Probabilities of the student's slips per event (see the module docstring)."""

    hard: float = 0.35
    easy: float = 0.02
    misread: float = 0.02


NO_SLIPS = SlipRates(0.0, 0.0, 0.0)

_INVERSE = {"+": "-", "-": "+", "*": "/", "/": "*"}
_SO = ("so", "so", "which gives", "that makes")
_NOW = ("Now {n} has", "Now {n} has", "Then {n} has", "{n} now has")
_CHECK = ("Check:", "Check:", "To check,", "Checking:")
_EVENT_STYLES = (("terse", 0.25), ("clause", 0.25), ("state", 0.2), ("check", 0.18), ("recap", 0.12))
_BEFORE = ("Before that", "Until then", "Before this")
_FINAL_STYLES = (("box", 0.15), ("short", 0.3), ("sentence", 0.25), ("formal", 0.15), ("merged", 0.15))


def render_solution(problem: ToyProblem, rng: random.Random, slips: SlipRates = SlipRates()) -> str:
    """One solution of ``problem`` as text: steps joined by ``"\\n\\n"``, ending with ``\\boxed{}``."""
    steps: list[str] = []
    if rng.random() < 0.25:
        steps.append(f"{problem.name} starts with {problem.start} {problem.item}.")
    value = problem.start
    for index, op in enumerate(problem.ops):
        operand, result, sentence = _perform(problem, index, value, op, rng, slips)
        steps.append(_event_step(problem, sentence, value, op.symbol, operand, result, rng))
        value = result
    final_style = _choose(rng, _FINAL_STYLES)
    if final_style == "merged":
        steps[-1] += f" The answer is \\boxed{{{value}}}."
    else:
        steps.append(_final_step(problem, value, final_style, rng))
    return STEP_SEPARATOR.join(steps)


def _perform(
    problem: ToyProblem, index: int, value: int, op: Op, rng: random.Random, slips: SlipRates
) -> tuple[int, int, str]:
    """The operand the student uses, the result they write, and the event sentence they read."""
    operand, sentence = op.operand, op.sentence
    others = sorted({o.operand for o in problem.ops if o.kind == op.kind and o.operand != op.operand})
    if others and rng.random() < slips.misread:
        misread = rng.choice(others)
        if _story_stays_valid(problem, index + 1, apply_op(op.kind, value, misread)):
            operand = misread
            sentence = re.sub(rf"\b{op.operand}\b", str(misread), sentence, count=1)
    result = apply_op(op.kind, value, operand)
    hard = needs_carry(op.kind, value, operand)
    if rng.random() < (slips.hard if hard else slips.easy):
        wrong = slipped_result(op.kind, value, operand) if hard else result + rng.choice((-1, 1))
        if wrong != result and _story_stays_valid(problem, index + 1, wrong):
            result = wrong
    return operand, result, sentence


def needs_carry(kind: str, a: int, b: int) -> bool:
    """Whether ``a <kind> b`` needs a carry (add, mul), a borrow (sub) or an odd tens digit (div)."""
    if kind == "add":
        return a % 10 + b % 10 >= 10
    if kind == "sub":
        return a % 10 < b % 10
    if kind == "mul":
        return (a % 10) * b >= 10
    return (a // 10) % 2 == 1


def slipped_result(kind: str, a: int, b: int) -> int:
    """The result written when the carry or borrow of ``a <kind> b`` is forgotten."""
    if kind == "add":
        return a + b - 10
    if kind == "sub":
        return a - b + 10
    if kind == "mul":
        return a * b - 10 * ((a % 10) * b // 10)
    return (a // 10 // 2) * 10 + (a % 10) // 2


def _story_stays_valid(problem: ToyProblem, next_index: int, value: int) -> bool:
    """Whether the events from ``next_index`` on, applied to ``value``, stay in range and exact."""
    for op in problem.ops[next_index:]:
        if value < 0 or value > MAX_VALUE or (op.kind == "div" and value % 2):
            return False
        value = op.apply(value)
    return 0 <= value <= MAX_VALUE


def _event_step(
    problem: ToyProblem, sentence: str, a: int, symbol: str, b: int, c: int, rng: random.Random
) -> str:
    name, item = problem.name, problem.item
    equation = f"{a} {symbol} {b} = {c}"
    check = f"{rng.choice(_CHECK)} {c} {_INVERSE[symbol]} {b} = {a}"
    now = rng.choice(_NOW).format(n=name)
    clause = sentence[:-1]
    style = _choose(rng, _EVENT_STYLES)
    if style == "terse":
        return f"{clause}: {equation}."
    if style == "clause":
        return f"{clause}, {rng.choice(_SO)} {equation}."
    if style == "state":
        return f"{sentence} {now} {equation} {item}."
    if style == "check":
        return f"{sentence} {now} {equation} {item}. {check}."
    before = rng.choice(_BEFORE)
    return f"{sentence} {before}, {name} had {a} {item}, so {name} has {equation} {item}. {check}, which is right."


def _final_step(problem: ToyProblem, value: int, style: str, rng: random.Random) -> str:
    boxed = f"\\boxed{{{value}}}"
    if style == "box":
        return boxed
    if style == "short":
        return f"The answer is {boxed}."
    if style == "sentence":
        return f"So {problem.name} has {value} {problem.item} {rng.choice(('now', 'in the end'))}. The answer is {boxed}."
    return f"Therefore, the final answer is: ${boxed}$. I hope it is correct."


def _choose(rng: random.Random, weighted: tuple[tuple[str, float], ...]) -> str:
    names, weights = zip(*weighted, strict=True)
    return rng.choices(names, weights)[0]
