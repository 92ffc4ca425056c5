"""Simulated problems: a prompt in the generator's chat layout, the question the PRM sees, the gold answer.

A prompt is `<|im_start|>system\\n` + the system prompt's words + `<|im_end|>\\n<|im_start|>user\\n` + a
level word (" L3") + question words + `<|im_end|>\\n<|im_start|>assistant\\n`. Everything about the problem
the simulated generator needs (level, correct answer, the order of its wrong answers) is read back from
the prompt tokens by `problem_facts`, so the generator's distributions stay a function of the prefix.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

from specscale.sim.hashing import mix64, prefix_key
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import ANSWERS, WorkloadParams


@dataclass(frozen=True)
class Problem:
    question: str  # what the PRM sees as the question
    prompt_ids: tuple[int, ...]  # the generator's prompt
    answer: str  # the gold answer (a \\boxed{} content)
    level: int


@dataclass(frozen=True)
class ProblemFacts:
    """What the generator reads from a prompt: level (1-based), correct answer index, the wrong answers'
    indices most popular first."""

    level: int
    answer: int
    wrong_answers: tuple[int, ...]


def prompt_end(token_ids, tokenizer: SyntheticTokenizer) -> int:
    """Length of the prompt: through the last "assistant" word and its newline."""
    last = len(token_ids) - 1 - token_ids[::-1].index(tokenizer.assistant)
    return last + 2


def problem_facts(prompt_ids, tokenizer: SyntheticTokenizer, seed: int) -> ProblemFacts:
    present = set(prompt_ids)
    level = next((k for k, token in enumerate(tokenizer.level_ids, start=1) if token in present), 1)
    key = prefix_key(seed, prompt_ids)
    answer = key % ANSWERS
    wrong = [a for a in range(ANSWERS) if a != answer]
    random.Random(mix64(key)).shuffle(wrong)
    return ProblemFacts(level, answer, tuple(wrong))


def make_problems(params: WorkloadParams, tokenizer: SyntheticTokenizer, count: int, seed: int) -> list[Problem]:
    """count problems: levels uniform, question lengths lognormal(question_tokens_median, sigma)."""
    rng = np.random.default_rng(seed)
    t = tokenizer
    system = [t.system_ids[k % len(t.system_ids)] for k in range(params.system_prompt_tokens)]
    head = [t.token_to_id("<|im_start|>"), t.token_to_id("system"), t.token_to_id("\n"), *system,
            t.eos, t.token_to_id("\n"), t.token_to_id("<|im_start|>"), t.token_to_id("user"), t.token_to_id("\n")]
    tail = [t.eos, t.token_to_id("\n"), t.token_to_id("<|im_start|>"), t.assistant, t.token_to_id("\n")]
    problems = []
    for _ in range(count):
        level = int(rng.integers(1, params.levels + 1))
        length = max(int(round(math.exp(rng.normal(math.log(params.question_tokens_median),
                                                    params.question_tokens_sigma)))), 1)
        words = [t.question_ids[k] for k in rng.integers(0, len(t.question_ids), length)]
        question_ids = [t.level_ids[level - 1], *words]
        prompt = tuple(head + question_ids + tail)
        facts = problem_facts(prompt, t, seed)
        problems.append(Problem(t.decode(question_ids).strip(), prompt, t.answer_values[facts.answer], level))
    return problems
