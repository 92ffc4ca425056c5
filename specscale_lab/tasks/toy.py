"""The toy reasoning task: chains of arithmetic facts stated in words, solved step by step.

A problem tells a short story about one person's collection of items (1..8 events, see toy_core.EVENT_WEIGHTS; every running
total stays in 0..30, at most 12 items come or go at once, "doubles"/"triples"/"half" scale it):

    Mia has 13 marbles. Mia finds 8 more. Mia gives 9 to Leo. Mia doubles the marbles.
    How many marbles does Mia have now?

and a solution takes one step per event, steps separated by ``"\\n\\n"``, ending with ``\\boxed{answer}``:

    Mia finds 8 more, so 13 + 8 = 21.

    Mia gives 9 to Leo. Now Mia has 21 - 9 = 12 marbles. Check: 12 + 9 = 21.

    12 * 2 = 24.

    The answer is \\boxed{24}.

Public API (everything later code needs; this module re-exports it):

- ``ToyProblem``: ``question``, ``answer`` (a decimal string), plus the chain it encodes (``name``,
  ``item``, ``start``, ``ops``; ``values`` = the running total after each event).
- ``toy_problems(split, n, seed) -> list[ToyProblem]``: ``n`` distinct problems of split ``"train"`` or
  ``"test"``, the same for the same arguments. The splits are disjoint by construction: a problem is in
  the test split iff a SHA-256 bucket of its question says so, whatever the seed.
- ``split_steps(text) -> list[str]``: a solution's steps (split on ``"\\n\\n"``, stripped, empties dropped).
- ``label_steps(problem, steps) -> list[bool]``: the step checker (``specscale_lab.tasks.toy_check``). A step
  is good iff its numbers come from the problem or from good earlier steps, its arithmetic is right, the
  equation it advances the story with is the next event of the problem, a boxed answer is the true one,
  and every earlier step is good.
- ``first_error(problem, steps) -> (step index, char offset) | None``: where the first error starts.
- ``extract_answer(text) -> str | None``: content of the last ``\\boxed{...}`` (braces matched).
- ``is_correct(problem, text) -> bool``: the extracted answer equals the true answer.
- ``generator_messages(question)``: the chat a generator is prompted with (system + user); render it
  with the chat template and ``add_generation_prompt=True``.
- ``TOY_GENERATOR_DIR``, ``TOY_PRM_DIR``: the bundled checkpoints (``specscale/assets``); load them with
  ``specscale_lab.tasks.toy_models.load_toy_models()``.
- Constants: ``GENERATOR_SYSTEM_PROMPT``, ``PRM_SYSTEM_PROMPT`` (Qwen2.5-Math-PRM's, verbatim),
  ``STEP_SEPARATOR`` (``"\\n\\n"``), ``PRM_STEP_TAG`` (``"<extra_0>"``).

Reference solutions (with the human-like slips the toy generator learns) are rendered by
``specscale_lab.tasks.toy_solutions``; the statistics of the bundled models come from
``python -m specscale_lab.tasks.toy_stats``.
"""

from __future__ import annotations

from specscale.defaults import ASSETS
from specscale.prompts import PRM_STEP_TAG, PRM_SYSTEM_PROMPT, STEP_SEPARATOR, chat_messages
from specscale.prompts import TOY_GENERATOR_SYSTEM_PROMPT as GENERATOR_SYSTEM_PROMPT
from specscale_lab.tasks.toy_check import first_error, label_steps
from specscale_lab.tasks.toy_core import (
    EVENT_WEIGHTS,
    MAX_OPS,
    MAX_VALUE,
    MIN_OPS,
    Op,
    ToyProblem,
    extract_answer,
    random_problem,
    split_of,
    split_steps,
    toy_problems,
)

__all__ = [
    "EVENT_WEIGHTS",
    "GENERATOR_SYSTEM_PROMPT",
    "MAX_OPS",
    "MAX_VALUE",
    "MIN_OPS",
    "PRM_STEP_TAG",
    "PRM_SYSTEM_PROMPT",
    "STEP_SEPARATOR",
    "TOY_GENERATOR_DIR",
    "TOY_PRM_DIR",
    "Op",
    "ToyProblem",
    "extract_answer",
    "first_error",
    "generator_messages",
    "is_correct",
    "label_steps",
    "random_problem",
    "split_of",
    "split_steps",
    "toy_problems",
]

ASSETS_DIR = ASSETS  # the bundled checkpoints ship with the serving system (specscale/assets/)
TOY_GENERATOR_DIR = ASSETS_DIR / "toy-generator"
TOY_PRM_DIR = ASSETS_DIR / "toy-prm"


def generator_messages(question: str) -> list[dict[str, str]]:
    """The chat the toy generator is prompted with; apply the chat template with add_generation_prompt=True."""
    return chat_messages(question, GENERATOR_SYSTEM_PROMPT)


def is_correct(problem: ToyProblem, text: str) -> bool:
    """Whether the solution ``text`` boxes the true answer."""
    answer = extract_answer(text)
    return answer is not None and answer.strip("$ ") == problem.answer
