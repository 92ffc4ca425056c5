"""The toy task's step checker: which steps of a solution are good, and where the first error is.

A step is good iff, read left to right,

1. its first equation ``x op y = z`` applies the next event of the story to the running total
   (``x`` = the total, ``op``/``y`` = the event; ``+`` and ``*`` may swap operands) and is true;
   the step then advances the story;
2. every later equation checks a result of the same step (``x`` a result of this step, ``y`` known)
   and is true;
3. every other number is known: a number of the problem or a result of a good step (or of this one);
4. a boxed answer is the true answer;
5. it is not empty; and every earlier step is good.

``first_error(problem, steps)`` returns ``(step index, character offset)`` of the first error, at the
first character that makes the text wrong (the first wrong digit of a result, the wrong operand, a
number that is too short: the character after it; an empty step: its end), or None for a solution
without errors. ``label_steps`` derives the step labels from it, so the two always agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from specscale_lab.tasks.toy_core import SYMBOLS, ToyProblem, apply_op

_EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
_NUMBER = re.compile(r"\d+")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_KIND_OF = {symbol: kind for kind, symbol in SYMBOLS.items()}


def first_error(problem: ToyProblem, steps: list[str]) -> tuple[int, int] | None:
    """``(step index, character offset within that step)`` of the first error, or None."""
    checker = _StepChecker(problem)
    for index, step in enumerate(steps):
        offset = checker.error_in(step)
        if offset is not None:
            return index, offset
    return None


def label_steps(problem: ToyProblem, steps: list[str]) -> list[bool]:
    """Per-step labels (True = good): every step before the first error is good, the rest are bad."""
    found = first_error(problem, steps)
    bad_from = len(steps) if found is None else found[0]
    return [index < bad_from for index in range(len(steps))]


def _mismatch(written: str, expected: str, start: int) -> int | None:
    """Offset of the first character where ``written`` (at ``start``) departs from ``expected``."""
    for i, (w, e) in enumerate(zip(written, expected, strict=False)):
        if w != e:
            return start + i
    if len(written) != len(expected):
        return start + min(len(written), len(expected))
    return None


def _true_result(x: int, symbol: str, y: int) -> int | None:
    kind = _KIND_OF[symbol]
    if kind == "div" and (y == 0 or x % y):
        return None
    return apply_op(kind, x, y)


@dataclass
class _StepChecker:
    """Walks a solution's steps, tracking the next event, the running total and the known numbers."""

    problem: ToyProblem
    index: int = 0
    value: int = 0
    known: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.value = self.problem.start
        self.known = {self.problem.start, *(op.operand for op in self.problem.ops)}

    def error_in(self, step: str) -> int | None:
        """Offset of the first error in ``step``, or None (then the story advances past it)."""
        if not step.strip():
            return len(step)
        results: set[int] = set()
        for start, kind, match in _items(step):
            if kind == "equation":
                offset = self._equation_error(match, results)
            elif kind == "boxed":
                offset = _mismatch(match[1].strip("$ "), self.problem.answer, match.start(1))
            else:
                offset = None if int(match[0]) in self.known | results else start
            if offset is not None:
                return offset
        self.known |= results
        return None

    def _equation_error(self, match: re.Match, results: set[int]) -> int | None:
        x, y, z = int(match[1]), int(match[3]), int(match[4])
        if not results:
            error = self._event_error(match)
            if error is None:
                self.index, self.value = self.index + 1, z
                results.add(z)
            return error
        if x not in results:
            return match.start(1)
        if y not in self.known | results:
            return match.start(3)
        return self._result_error(match)

    def _event_error(self, match: re.Match) -> int | None:
        """Where the step's first equation departs from the next event, or from true arithmetic."""
        if self.index >= len(self.problem.ops):
            return match.start(1)
        op = self.problem.ops[self.index]
        first, second = self.value, op.operand
        if op.symbol in "+*" and int(match[1]) != first and int(match[1]) == second:
            first, second = second, first
        for group, expected in zip((1, 2, 3), (str(first), op.symbol, str(second)), strict=True):
            error = _mismatch(match[group], expected, match.start(group))
            if error is not None:
                return error
        return self._result_error(match)

    @staticmethod
    def _result_error(match: re.Match) -> int | None:
        true = _true_result(int(match[1]), match[2], int(match[3]))
        if true is None:
            return match.start(4)
        return _mismatch(match[4], str(true), match.start(4))


def _items(step: str) -> list[tuple[int, str, re.Match]]:
    """Equations, the boxed answer and the other numbers of ``step``, in reading order."""
    items = [(m.start(), "equation", m) for m in _EQUATION.finditer(step)]
    items += [(m.start(1), "boxed", m) for m in _BOXED.finditer(step)]
    taken = [(m.start(), m.end()) for _, _, m in items]
    for m in _NUMBER.finditer(step):
        if not any(a <= m.start() < b for a, b in taken):
            items.append((m.start(), "number", m))
    return sorted(items, key=lambda item: item[0])
