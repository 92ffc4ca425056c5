"""The toy task's data model: problems, their splits, and reading answers and steps out of text.

See ``specscale_lab.tasks.toy`` for the public API and an example problem.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from specscale.prompts import STEP_SEPARATOR

MAX_VALUE = 30
MAX_OPERAND = 12  # largest number added or taken away in one event
# Events per problem: 1..8, drawn with these weights in both splits (so the test split's mix is 1/7 each
# for 1..6 events, 1/14 each for 7 and 8; docs/toy-models.md, "The task"). Long stories are half as
# frequent: they are what a 3M-parameter generator and its PRM learn last.
EVENT_WEIGHTS = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 1, 8: 1}
MIN_OPS, MAX_OPS = min(EVENT_WEIGHTS), max(EVENT_WEIGHTS)
TEST_BUCKETS = 8  # one question in TEST_BUCKETS belongs to the test split

NAMES = ("Mia", "Leo", "Ava", "Sam", "Zoe", "Max", "Ivy", "Ben", "Eva", "Tom", "Amy", "Dan")
ITEMS = ("marbles", "apples", "coins", "stickers", "cards", "books", "pens", "shells", "stamps", "cookies")
SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}

_ADD_SENTENCES = ("{n} finds {b} more.", "{n} buys {b} more.", "{n} gets {b} more from {m}.")
_SUB_SENTENCES = ("{n} gives {b} to {m}.", "{n} loses {b}.", "{n} sells {b}.")
_MUL_SENTENCES = {2: "{n} doubles the {item}.", 3: "{n} triples the {item}."}
_DIV_SENTENCE = "{n} gives half of the {item} to {m}."


@dataclass(frozen=True)
class Op:
    """One event of a story: ``kind`` in add/sub/mul/div applied with ``operand``, told by ``sentence``."""

    kind: str
    operand: int
    sentence: str

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.kind]

    def apply(self, value: int) -> int:
        return apply_op(self.kind, value, self.operand)


@dataclass(frozen=True)
class ToyProblem:
    """A toy word problem with its known answer and the chain of events it encodes."""

    question: str
    answer: str
    name: str
    item: str
    start: int
    ops: tuple[Op, ...]

    @property
    def values(self) -> tuple[int, ...]:
        """The running total: ``start`` and the value after each event."""
        out = [self.start]
        for op in self.ops:
            out.append(op.apply(out[-1]))
        return tuple(out)


def apply_op(kind: str, a: int, b: int) -> int:
    """The true result of ``a <kind> b`` (integer division is exact in this task)."""
    if kind == "add":
        return a + b
    if kind == "sub":
        return a - b
    if kind == "mul":
        return a * b
    return a // b


def toy_problems(split: str, n: int, seed: int) -> list[ToyProblem]:
    """``n`` distinct problems of ``split`` ("train" or "test"), reproducible from ``seed``."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    rng = random.Random(f"toy-{split}-{seed}")
    seen: set[str] = set()
    out: list[ToyProblem] = []
    while len(out) < n:
        problem = random_problem(rng)
        if problem.question in seen or split_of(problem.question) != split:
            continue
        seen.add(problem.question)
        out.append(problem)
    return out


def split_of(question: str) -> str:
    """The split a question belongs to, fixed by a hash of its text."""
    bucket = hashlib.sha256(question.encode()).digest()[0] % TEST_BUCKETS
    return "test" if bucket == 0 else "train"


def random_problem(rng: random.Random) -> ToyProblem:
    """Draw one problem: a start value and ``event_count`` events that keep the total within 0..MAX_VALUE."""
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    start = rng.randint(2, 20)
    fields = {"n": name, "m": other, "item": item}
    ops: list[Op] = []
    value = start
    for _ in range(event_count(rng)):
        kind, operand = random_event(rng, value)
        ops.append(Op(kind, operand, _sentence(rng, kind, operand).format(b=operand, **fields)))
        value = ops[-1].apply(value)
    sentences = " ".join(op.sentence for op in ops)
    question = f"{name} has {start} {item}. {sentences} How many {item} does {name} have now?"
    return ToyProblem(question, str(value), name, item, start, tuple(ops))


def event_count(rng: random.Random) -> int:
    """How many events a new problem tells, drawn from ``EVENT_WEIGHTS``."""
    counts = list(EVENT_WEIGHTS)
    return rng.choices(counts, weights=[EVENT_WEIGHTS[count] for count in counts])[0]


def random_event(rng: random.Random, value: int) -> tuple[str, int]:
    """An event ``(kind, operand)`` that keeps ``value`` within 0..MAX_VALUE (and halves only even ones)."""
    kinds = []
    if value < MAX_VALUE:
        kinds += ["add"] * 4
    if value > 0:
        kinds += ["sub"] * 4
    if 0 < value <= MAX_VALUE // 2:
        kinds.append("mul")
    if value > 0 and value % 2 == 0:
        kinds.append("div")
    kind = rng.choice(kinds)
    if kind == "add":
        return kind, rng.randint(1, min(MAX_OPERAND, MAX_VALUE - value))
    if kind == "sub":
        return kind, rng.randint(1, min(MAX_OPERAND, value))
    if kind == "mul":
        return kind, 3 if value <= MAX_VALUE // 3 and rng.random() < 0.4 else 2
    return kind, 2


def _sentence(rng: random.Random, kind: str, operand: int) -> str:
    if kind == "add":
        return rng.choice(_ADD_SENTENCES)
    if kind == "sub":
        return rng.choice(_SUB_SENTENCES)
    if kind == "mul":
        return _MUL_SENTENCES[operand]
    return _DIV_SENTENCE


def split_steps(text: str) -> list[str]:
    """A solution's steps: pieces between ``"\\n\\n"``, stripped, empty ones dropped."""
    return [s.strip() for s in text.split(STEP_SEPARATOR) if s.strip()]


def extract_answer(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (nested braces matched), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None
