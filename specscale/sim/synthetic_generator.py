"""SyntheticGenerator: the simulated generator's next-token logits, a deterministic function of the prefix.

See `workload.py` for the distributions. The state a distribution depends on is read off the prefix:
the problem (from the prompt), the steps done (delimiters), the current step's tokens, whether a slip
opener occurred, whether the step opened as the final one and whether the answer is out. It is kept per
engine sequence and advanced by one token per iteration; a sequence seen for the first time (a fork, a
split, a preempted one) is scanned from its tokens. Identical prefixes therefore give identical logits, so
computation deduplication and the engine's multi-draw sampling work unchanged.

Logits are assembled from cached log-probability rows (per level and step for openers, per position in the
step for words) plus a few overrides per row (the dominant token, the answer), at the reference temperature.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from specscale.engine.sequence import Sequence
from specscale.sim.hashing import mix64, prefix_key
from specscale.sim.problems import ProblemFacts, problem_facts, prompt_end
from specscale.sim.runner import HeadModel
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import (
    REFERENCE_TEMPERATURE,
    WorkloadParams,
    hazard,
    slip_rates,
    step_tokens_pmf,
    steps_pmf,
    wrong_answer_weights,
)

STATE_CACHE_SIZE = 1 << 16  # engine sequences whose state is kept (LRU)


@dataclass
class PathState:
    """A generating path as the distribution sees it (invariant: it covers token_ids[:length])."""

    length: int
    facts: ProblemFacts
    steps_done: int  # delimiters after the prompt
    step_key: int  # prefix_key of the path up to the current step's start
    step_len: int = 0  # tokens of the current step so far
    step_hash: int = 0  # rolling hash of them
    erred: bool = False  # a slip opener occurred
    final: bool = False  # the current step opened as the last one
    answered: bool = False  # the answer token is out: EOS comes next


def log(x: float) -> float:
    return float(np.log(x)) if x > 0 else -np.inf


class SyntheticGenerator(HeadModel):
    """Next-token logits over the tokenizer's first `generated_size` ids; `seed` must be the problems' seed."""

    def __init__(self, params: WorkloadParams, tokenizer: SyntheticTokenizer, seed: int):
        self.params, self.tokenizer, self.seed = params, tokenizer, seed
        self.head_size = tokenizer.generated_size
        self.final_hazard = [hazard(steps_pmf(params, level)) for level in range(1, params.levels + 1)]
        self.end_hazard = hazard(step_tokens_pmf(params))  # [j]: P(step of j + 2 tokens | at least j + 2)
        self.slip = slip_rates(params)
        self.wrong_log_weights = np.log(wrong_answer_weights(params))
        self._templates: dict[tuple, tuple[np.ndarray, tuple[float, ...]]] = {}
        self._states: OrderedDict[int, PathState] = OrderedDict()
        self._facts: dict[tuple[int, ...], ProblemFacts] = {}
        t = tokenizer
        self._finals = frozenset((t.final_good, t.final_slip))
        self._answers = frozenset(t.answer_ids)

    # ---- HeadModel ---------------------------------------------------------------------------------------
    def outputs(self, items: list[tuple[Sequence, int]]) -> torch.Tensor:
        rows, over_rows, over_cols, over_vals = [], [], [], []
        for r, (seq, position) in enumerate(items):
            if position != len(seq.token_ids) - 1:
                raise ValueError("the simulated generator only predicts a sequence's next token")
            template, cols, vals = self._distribution(self._state(seq))
            rows.append(template)
            over_rows += [r] * len(cols)
            over_cols += cols
            over_vals += vals
        logp = np.array(rows)  # [R, generated_size] (np.stack of many small rows is several times slower)
        logp[over_rows, over_cols] = over_vals
        return torch.from_numpy(logp * REFERENCE_TEMPERATURE)  # logits = T_ref * log p: softmax(logits / T_ref) = p

    # ---- the state ---------------------------------------------------------------------------------------
    def _state(self, seq: Sequence) -> PathState:
        ids = seq.token_ids
        state = self._states.get(seq.seq_id)
        if state is not None and state.length == len(ids) - 1:
            self._push(state, ids)
        elif state is None or state.length != len(ids):
            state = self._scan(ids)
            self._states[seq.seq_id] = state
            if len(self._states) > STATE_CACHE_SIZE:
                self._states.popitem(last=False)
        self._states.move_to_end(seq.seq_id)
        return state

    def _scan(self, ids: list[int]) -> PathState:
        t = self.tokenizer
        end = prompt_end(ids, t)
        prompt = tuple(ids[:end])
        facts = self._facts.get(prompt)
        if facts is None:
            facts = self._facts[prompt] = problem_facts(prompt, t, self.seed)
        generated = ids[end:]
        steps_done = generated.count(t.delimiter)
        start = len(ids)
        while start > end and ids[start - 1] != t.delimiter:
            start -= 1
        state = PathState(start, facts, steps_done, prefix_key(self.seed, ids[:start]),
                          erred=not t.slip_ids.isdisjoint(generated))
        while state.length < len(ids):  # the current step's tokens (no delimiter among them)
            self._push(state, ids)
        return state

    def _push(self, state: PathState, ids: list[int]) -> None:
        """Advance state by the token ids[state.length]."""
        token = ids[state.length]
        state.length += 1
        if token == self.tokenizer.delimiter:
            state.steps_done += 1
            state.step_key = prefix_key(self.seed, ids[: state.length])
            state.step_len = state.step_hash = 0
            state.final = False
            return
        state.step_len += 1
        state.step_hash = mix64(state.step_hash ^ token)
        if state.step_len == 1:
            state.final = token in self._finals
            state.erred = state.erred or token in self.tokenizer.slip_ids
        state.answered = state.answered or token in self._answers

    # ---- the distribution --------------------------------------------------------------------------------
    def _distribution(self, state: PathState) -> tuple[np.ndarray, list[int], list[float]]:
        """(log-probability row, override columns, override values) of the next token."""
        t = self.tokenizer
        if state.answered:
            return self._template(("eos",)), [], []
        if state.step_len == 0:
            level, k = state.facts.level, min(state.steps_done, self.params.max_steps - 1)
            row, (good, slip) = self._template(("open", level, k), with_masses=True)
            n = len(t.good_openers)
            return row, [t.good_openers[mix64(state.step_key) % n], t.slip_openers[mix64(state.step_key + 1) % n]], \
                [good, slip]
        i = min(state.step_len - 1, len(self.end_hazard) - 1)
        row, (dominant,) = self._template(("word", i), with_masses=True)
        cols = [t.words[mix64(state.step_key ^ state.step_hash) % len(t.words)]]
        vals = [dominant]
        if state.final:  # the step ends with the answer, not the delimiter
            end = log(self.end_hazard[i])
            answers, weights = self._answer_choices(state)
            cols += [t.delimiter, *answers]
            vals += [-np.inf, *(end + w for w in weights)]
        return row, cols, vals

    def _answer_choices(self, state: PathState) -> tuple[list[int], list[float]]:
        """A sound path boxes the correct answer; an erred one a wrong answer, Zipf-weighted."""
        ids = self.tokenizer.answer_ids
        if not state.erred:
            return [ids[state.facts.answer]], [0.0]
        return [ids[a] for a in state.facts.wrong_answers], list(self.wrong_log_weights)

    def _template(self, key: tuple, with_masses: bool = False):
        cached = self._templates.get(key)
        if cached is None:
            cached = self._templates[key] = self._build(key)
        return cached if with_masses else cached[0]

    def _build(self, key: tuple) -> tuple[np.ndarray, tuple[float, ...]]:
        """A log-probability row with each class spread evenly, and the dominant tokens' log-probabilities."""
        t, q = self.tokenizer, self.params.top_token_prob
        row = np.full(self.head_size, -np.inf, dtype=np.float32)
        if key[0] == "eos":
            row[t.eos] = 0.0
            return row, ()
        if key[0] == "open":
            _, level, k = key
            final, slip = self.final_hazard[level - 1][k], self.slip[level - 1]
            row[t.final_good], row[t.final_slip] = log(final * (1 - slip)), log(final * slip)
            good = spread_class(row, t.good_openers, (1 - final) * (1 - slip), q)
            erred = spread_class(row, t.slip_openers, (1 - final) * slip, q)
            return row, (good, erred)
        ends = self.end_hazard[key[1]]
        row[t.delimiter] = log(ends)
        return row, (spread_class(row, t.words, 1 - ends, q),)


def spread_class(row: np.ndarray, ids: list[int], mass: float, top: float) -> float:
    """Spread mass over ids, (1 - top) evenly; return the dominant token's log-probability (mass * top)."""
    if len(ids) == 1:
        row[ids[0]] = log(mass)
        return log(mass)
    row[ids] = log(mass * (1 - top) / (len(ids) - 1))
    return log(mass * top)
