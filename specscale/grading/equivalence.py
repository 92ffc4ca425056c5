"""Whether two final answers are one answer: `AnswerGrader`.

Checks, cheapest first:

1. the same text (after surrounding space and ``$``) -> equivalent;
2. both plain numbers (``12``, ``-3.5``, ``1,450,000``, MATH's ``10,\\!080``) -> compared exactly as
   fractions when equal or both integers; this is the whole story for the toy task and GSM8K, and it
   never leaves the calling thread;
3. otherwise math-verify (``\\frac{1}{2}`` = ``0.5`` = ``1/2``, intervals, tuples, ``90^\\circ`` = ``90``,
   ``\\text{(C)}`` = ``C``, matrices), run in a worker process with a timeout (`specscale.grading.worker`
   says why a process) and cached per (gold, answer) pair. A timed-out comparison counts as not
   equivalent, and so does a pair in which an answer is longer than `MAX_ANSWER_CHARS` (answers are
   short: MATH-500's longest gold answer has 53 characters; a long box is a degenerate path).

math-verify's rules are not symmetric (gold first), so `equivalent(gold, answer)` keeps that order, and
`group` puts each group's first member in the gold role. A grader is thread-safe: the server builds
its search results (and votes) in its engine thread, `specscale eval` grades in its main thread, and
both share `shared_grader()`, the process's one grader (one worker process, one cache).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from specscale.grading.worker import VerifyWorker

DEFAULT_TIMEOUT_S = 5.0  # math-verify's own default per comparison
MAX_ANSWER_CHARS = 512
CACHE_SIZE = 1 << 16  # (gold, answer) verdicts kept
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
NUMBER_SPACING = {"\\!": "", "\\,": "", "{,}": ","}  # LaTeX around thousands separators: MATH's 10,\!080


@dataclass
class GraderStats:
    """How comparisons were decided (since the grader was made)."""

    same_text: int = 0
    numbers: int = 0
    cached: int = 0
    math_verify: int = 0
    timeouts: int = 0


class AnswerGrader:
    """Answer equivalence as the module docstring describes; thread-safe, one worker process each."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, cache_size: int = CACHE_SIZE):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self.stats = GraderStats()
        self._worker = VerifyWorker()
        self._verdicts: OrderedDict[tuple[str, str], tuple[bool | None, float]] = OrderedDict()  # verdict, timeout
        self._lock = threading.Lock()

    def equivalent(self, gold: str, answer: str, timeout_s: float | None = None) -> bool:
        """Whether `answer` is the same mathematical answer as `gold` (see the module docstring)."""
        gold, answer = bare(gold), bare(answer)
        with self._lock:
            if gold == answer:
                self.stats.same_text += 1
                return True
            numbers = compare_numbers(gold, answer)
            if numbers is not None:
                self.stats.numbers += 1
                return numbers
            if max(len(gold), len(answer)) > MAX_ANSWER_CHARS:
                return False
            return self._verified(gold, answer, timeout_s or self.timeout_s)

    def group(self, answers: Sequence[str], timeout_s: float | None = None) -> list[int]:
        """Group of each answer: the first group (in order of appearance) whose first member it is
        equivalent to, else a new group. Groups are numbered 0, 1, ... in order of appearance."""
        firsts: list[str] = []
        groups = []
        for answer in answers:
            group = next((g for g, first in enumerate(firsts) if self.equivalent(first, answer, timeout_s)), None)
            if group is None:
                group = len(firsts)
                firsts.append(answer)
            groups.append(group)
        return groups

    def start(self) -> None:
        """Start the math-verify worker now rather than at the first comparison that needs it."""
        self._worker.start()

    def close(self) -> None:
        """Stop the worker process (a later comparison starts it again)."""
        self._worker.close()

    def _verified(self, gold: str, answer: str, timeout_s: float) -> bool:
        """math-verify's verdict, cached; a timed-out pair is tried again only with a longer timeout
        (votes allow less time than grading). The caller holds the lock."""
        key = (gold, answer)
        verdict, tried_s = self._verdicts.get(key, (None, 0.0))
        if key in self._verdicts and (verdict is not None or timeout_s <= tried_s):
            self.stats.cached += 1
            self._verdicts.move_to_end(key)
            return bool(verdict)
        verdict = self._worker.equivalent(gold, answer, timeout_s)
        self.stats.math_verify += 1
        self.stats.timeouts += verdict is None
        self._verdicts[key] = (verdict, timeout_s)
        self._verdicts.move_to_end(key)
        if len(self._verdicts) > self.cache_size:
            self._verdicts.popitem(last=False)
        return bool(verdict)


def bare(answer: str) -> str:
    """An answer without surrounding space and ``$``."""
    return answer.strip().strip("$").strip()


def plain_number(answer: str) -> Fraction | None:
    """The value of a plain decimal number (optionally with thousands separators); None otherwise."""
    for spacing, replacement in NUMBER_SPACING.items():
        answer = answer.replace(spacing, replacement)
    if not PLAIN_NUMBER.fullmatch(answer):
        return None
    return Fraction(answer.replace(",", ""))


def compare_numbers(gold: str, answer: str) -> bool | None:
    """True / False when both are plain numbers and that settles it (equal, or unequal integers); None
    when math-verify must decide (not both numbers, or unequal decimals: it compares them rounded)."""
    a, b = plain_number(gold), plain_number(answer)
    if a is None or b is None:
        return None
    if a == b:
        return True
    return False if a.denominator == 1 and b.denominator == 1 else None


_shared: AnswerGrader | None = None
_shared_lock = threading.Lock()


def shared_grader() -> AnswerGrader:
    """The process's grader, made on first use (its worker process starts on the first comparison that
    needs math-verify)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = AnswerGrader()
        return _shared
