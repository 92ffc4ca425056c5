"""Arithmetic drills: the toy generator's pretraining text.

Real LLMs know their arithmetic from pretraining before they are taught to solve problems; the toy
generator gets the same head start. A drill example is a run of equations in the exact format of the
solutions (`` 17 + 5 = 22.``), drawn like the task's events and the checks that undo them; the loss
covers the results only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from specscale_lab.tasks.toy_core import MAX_VALUE, SYMBOLS, apply_op, random_event
from specscale_lab.tasks.toy_corrupt import wrong_number

IGNORE = -100
_INVERSE = {"add": "sub", "sub": "add", "mul": "div", "div": "mul"}


def random_equation(rng: random.Random) -> tuple[int, str, int, int]:
    """``(a, symbol, b, c)`` with ``a symbol b = c``: an event of the task applied to a random total,
    or (one time in three) the check that undoes it (``c - b = a``)."""
    value = rng.randint(0, MAX_VALUE)
    kind, operand = random_event(rng, value)
    result = apply_op(kind, value, operand)
    if rng.random() < 1 / 3:
        return result, SYMBOLS[_INVERSE[kind]], operand, value
    return value, SYMBOLS[kind], operand, result


def drill_examples(tokenizer, rng: random.Random, equations: int = 16) -> Iterator[tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` runs of ``equations`` equations; labels only on each result and its dot."""
    while True:
        ids: list[int] = []
        labels: list[int] = []
        for _ in range(equations):
            a, symbol, b, c = random_equation(rng)
            head = tokenizer.encode(f" {a} {symbol} {b} =", add_special_tokens=False)
            tail = tokenizer.encode(f" {c}.", add_special_tokens=False)
            ids += head + tail
            labels += [IGNORE] * len(head) + tail
        yield ids, labels


def verification_drill(tokenizer, rng: random.Random, tag_id: int, equations: int = 16) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` for the PRM: a run of equations whose shown result is right half the time
    (else a dropped carry or another plausible wrong number), each followed by the step tag. Labels: on
    every result digit, 1 while the digits so far agree with the true result; on the dot and the tag, 1
    iff the whole result is right."""
    space = tokenizer.encode(" ", add_special_tokens=False)
    ids: list[int] = []
    labels: list[int] = []
    for _ in range(equations):
        a, symbol, b, c = random_equation(rng)
        shown = c if rng.random() < 0.5 else wrong_number(c, rng)
        head = tokenizer.encode(f" {a} {symbol} {b} =", add_special_tokens=False)
        ids += head
        labels += [IGNORE] * len(head)
        digits, truth = str(shown), str(c)
        ids += space
        labels += [IGNORE] * len(space)
        for i, digit in enumerate(digits):  # digits are single tokens
            ids += tokenizer.encode(digit, add_special_tokens=False)
            labels.append(int(digits[: i + 1] == truth[: i + 1]))
        right = int(shown == c)
        ids += tokenizer.encode(".", add_special_tokens=False) + [tag_id]
        labels += [right, right]
    return ids, labels
