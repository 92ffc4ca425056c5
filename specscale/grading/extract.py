"""A solution's final answer, read as Qwen2.5-Math's evaluation parser (which search-and-learn uses)
reads it: the content of the last ``\\boxed{...}`` with its braces matched.

Fallbacks, in that parser's order where they make sense for search paths:

- ``\\fbox{...}`` counts as a box, and ``\\boxed 5`` (no braces) boxes the text up to the next ``$``
  or the end of the line;
- with no box at all, the text after the last "answer is" (``The answer is 18.``, ``the final answer
  is: $x=2$``) up to the end of its line, without the closing period or ``$``.

Unlike that parser this one does not fall back to the last number in the text: a search path that never
states an answer is usually one cut off mid-solution, and its last number is an intermediate result, so
it should not vote. An opened but unclosed box (a truncated path) is no answer either.
"""

from __future__ import annotations

import re

BOX_COMMANDS = ("\\boxed", "\\fbox")
ANSWER_PHRASE = re.compile(r"answer is\s*:?", re.IGNORECASE)
HOPE_TAIL = re.compile(r"\.?\s*I hope it is correct\.?\s*$", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The final answer stated in a solution (see the module docstring); None if it states none."""
    box = max(text.rfind(command) for command in BOX_COMMANDS)
    if box >= 0:
        return boxed_content(text, box)
    phrases = list(ANSWER_PHRASE.finditer(text))
    if not phrases:
        return None
    return clean_answer(text[phrases[-1].end():].split("\n", 1)[0])


def boxed_content(text: str, box: int) -> str | None:
    """Content of the box command starting at index `box`: braces matched, or the bare token form."""
    start = _after_command(text, box)
    if not text.startswith("{", start):  # \boxed 5$: up to the math delimiter or the line's end
        return clean_answer(re.split(r"[$\n]", text[start:], maxsplit=1)[0])
    depth = 0
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return clean_answer(text[start + 1:end])
    return None  # the box never closes: a truncated path


def _after_command(text: str, box: int) -> int:
    """Index just past the box command at `box` (and any spaces after it)."""
    end = box + 1
    while end < len(text) and text[end].isalpha():
        end += 1
    while end < len(text) and text[end] == " ":
        end += 1
    return end


def clean_answer(answer: str) -> str | None:
    """An answer without surrounding space, ``$`` and a closing period; None when nothing is left."""
    answer = HOPE_TAIL.sub("", answer).strip().strip("$").strip()
    answer = answer.removesuffix(".").strip()
    return answer or None
