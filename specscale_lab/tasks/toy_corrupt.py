"""Corrupted copies of good toy solutions: one step made wrong, the PRM's hardest negatives.

``corrupt_steps(problem, steps, rng) -> list[str]`` copies a solution's steps and breaks one step that
states an equation or a boxed answer, in one of the ways a reasoner goes wrong:

- ``result``: a wrong result (``wrong_number``: off by one or ten, digits swapped, a forgotten carry,
  any number);
- ``operand``: the event's operand replaced (and the arithmetic redone correctly, so only the operand
  is wrong), sometimes in the step's restatement of the event too;
- ``value``: a wrong running total carried into the equation (arithmetic redone correctly);
- ``operation``: the wrong operation applied (``23 - 14 = 9`` for "finds 14 more");
- ``box``: a wrong boxed answer.

The later steps are kept unchanged; the checker (``label_steps``) gives the labels.
"""

from __future__ import annotations

import random
import re

from specscale_lab.tasks.toy_core import MAX_VALUE, SYMBOLS, ToyProblem, apply_op

_EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
_BOXED = re.compile(r"\\boxed\{(\d+)\}")
_KIND_OF = {symbol: kind for kind, symbol in SYMBOLS.items()}
_OTHER_SYMBOL = {"+": ("-", "*"), "-": ("+",), "*": ("+", "/"), "/": ("-", "*")}


def corrupt_steps(problem: ToyProblem, steps: list[str], rng: random.Random) -> list[str]:
    """A copy of ``steps`` with one equation or boxed step made wrong (unchanged if there is none)."""
    targets = [i for i, step in enumerate(steps) if _EQUATION.search(step) or _BOXED.search(step)]
    if not targets:
        return list(steps)
    i = rng.choice(targets)
    out = list(steps)
    match = _EQUATION.search(steps[i])
    if match is None or (_BOXED.search(steps[i]) and rng.random() < 0.3):
        out[i] = _corrupt_box(steps[i], rng)
    else:
        out[i] = _corrupt_equation(problem, steps[i], match, rng)
    return out


def wrong_number(value: int, rng: random.Random) -> int:
    """A plausible wrong version of ``value`` (never ``value`` itself, never negative): a dropped carry
    or borrow (off by ten) a third of the time when ``value`` >= 10, else off by one or two, up by ten,
    its digits swapped, or any number of the task's range."""
    if value >= 10 and rng.random() < 1 / 3:
        return value - 10
    swapped = int(str(value)[::-1])
    options = [value + 1, value - 1, value + 10, value + 2, swapped, rng.randint(0, MAX_VALUE)]
    return rng.choice([v for v in options if v >= 0 and v != value])


def _corrupt_equation(problem: ToyProblem, step: str, match: re.Match, rng: random.Random) -> str:
    original = (int(match[1]), match[2], int(match[3]))
    x, symbol, y = original
    how = rng.choice(("result", "result", "operand", "value", "operation"))
    if how == "operand":
        others = [op.operand for op in problem.ops if op.operand != y]
        y = rng.choice(others) if others and rng.random() < 0.5 else wrong_number(y, rng)
        if rng.random() < 0.5:
            step = _restate_operand(step, match, y)
    elif how == "value":
        x = wrong_number(x, rng)
    elif how == "operation":
        symbol = rng.choice(_OTHER_SYMBOL[symbol])
    result = _result(x, symbol, y)
    if how == "result" or result is None or (x, symbol, y) == original:
        (x, symbol, y), result = original, wrong_number(int(match[4]), rng)
    start, end = _span_in(step, match)
    return f"{step[:start]}{x} {symbol} {y} = {result}{step[end:]}"


def _span_in(step: str, match: re.Match) -> tuple[int, int]:
    """Where the matched equation sits in ``step`` (which may have been edited before it)."""
    found = step.find(match[0])
    return found, found + len(match[0])


def _restate_operand(step: str, match: re.Match, new_operand: int) -> str:
    """Replace the operand's first mention before the equation (the step's restatement of the event)."""
    head, tail = step[: match.start()], step[match.start() :]
    return re.sub(rf"\b{match[3]}\b", str(new_operand), head, count=1) + tail


def _result(x: int, symbol: str, y: int) -> int | None:
    kind = _KIND_OF[symbol]
    if kind == "div" and (y == 0 or x % y):
        return None
    value = apply_op(kind, x, y)
    return value if 0 <= value <= 3 * MAX_VALUE else None


def _corrupt_box(step: str, rng: random.Random) -> str:
    match = _BOXED.search(step)
    if match is None:
        return step
    wrong = wrong_number(int(match[1]), rng)
    return f"{step[: match.start(1)]}{wrong}{step[match.end(1) :]}"
