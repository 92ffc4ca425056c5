"""SyntheticPRM: the simulated PRM's readouts, behind the real `Verifier` and its PRM input formats.

The verifier builds each path's PRM input with its format (`verify/formats.py`) from the synthetic
tokenizer, reuses cached step prefixes and asks the engine for readouts at the score positions, exactly as
with a real PRM. At a score position the synthetic PRM reads whether the path has erred by then (a slip
opener among the tokens before it), draws the workload's score for that class from a hash of the whole
prefix (so a step's score is a function of its path, whatever batch or cache state scores it); whether
it notices a path's error at all is drawn once per path, from the prefix through its first slip. With the
workload's step_persistence the continuous part's normal is an AR(1) chain along the path: a readout finds the
path's earlier steps' score positions in its input (after each step's opener, the last step tag for
qwen-math-prm, the position before the last "+" for rlhflow), redraws their normals from their own prefixes and
chains them, so a step's score still depends on its path only and siblings share their parent's draws; with
step_drift the mean moves by that much per step (the step's index: the step openers before it). It
returns a readout whose format's score formula gives back that score:

- qwen-math-prm (2-class score head): logits (0, logit(score)); softmax(...)[1] = score, and logits
  (0, 100) give exactly 1.0 in float32, as a sure bf16 PRM does;
- rlhflow (LM head over the vocabulary): logit(score) at "+" and 0 at "-"; softmax over that pair.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch

from specscale.engine.sequence import Sequence
from specscale.prompts import PRM_STEP_TAG
from specscale.sim.hashing import mix64, prefix_key, unit_interval
from specscale.sim.runner import HeadModel
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import PRMScoreParams

SURE_LOGIT = 100.0  # a logit difference whose softmax rounds to exactly 1.0 in float32
FORMAT_TEMPLATES = {"qwen-math-prm": "chatml", "rlhflow": "llama3"}  # the chat template each format renders


class SyntheticPRM(HeadModel):
    def __init__(self, params: PRMScoreParams, tokenizer: SyntheticTokenizer, format_name: str, seed: int):
        if format_name not in FORMAT_TEMPLATES:
            raise ValueError(f"unknown PRM format {format_name!r}; known: {sorted(FORMAT_TEMPLATES)}")
        self.params, self.tokenizer, self.format_name, self.seed = params, tokenizer, format_name, seed
        self.head_size = 2 if format_name == "qwen-math-prm" else tokenizer.vocab_size
        self.plus_id, self.minus_id = tokenizer.encode("+")[-1], tokenizer.encode("-")[-1]
        self.opener_ids = opener_ids(tokenizer)
        self.tag_id = tokenizer.encode(PRM_STEP_TAG)[-1] if format_name == "qwen-math-prm" else None

    def score(self, token_ids, position: int) -> float:
        """The score read at `position` of a PRM input (a function of token_ids[:position + 1]); with the
        workload's partial_correlation, part of it is drawn once per step (from the prefix through the step's
        opener), so a readout after part of a step (partial-step rejection) and the one after all of it agree."""
        prefix = token_ids[: position + 1]
        if self.params.step_persistence > 0 or self.params.step_drift != 0:
            return self._persistent_score(prefix)
        readout, step, choice = self._uniforms(prefix, None)
        if step is None:
            return self.params.score(self.sees_error(prefix), *readout)
        return self.params.readout_score(self.sees_error(prefix), readout, step, choice)

    def _uniforms(self, prefix, start: int | None) -> tuple[tuple[float, float], tuple[float, float] | None, float]:
        """Every draw of the readout that ends `prefix`: its own uniforms (perfect, value); with
        partial_correlation, its step's (drawn from the prefix through the opener at `start`, found when None)
        and the uniform choosing between them (else None and 0)."""
        key = prefix_key(self.seed, prefix)
        readout = (unit_interval(key), unit_interval(mix64(key)))
        if self.params.partial_correlation == 0:
            return readout, None, 0.0
        start = self._step_start(prefix) if start is None else start
        step_key = prefix_key(self.seed + 2, prefix[: start + 1])
        return readout, (unit_interval(step_key), unit_interval(mix64(step_key))), unit_interval(mix64(mix64(key)))

    def _draws(self, prefix, start: int) -> tuple[float, float]:
        """(the perfect branch's uniform, the continuous part's normal) of the readout that ends `prefix`, in a
        step that opens at `start`: the same draws `score` makes without step_persistence."""
        readout, step, choice = self._uniforms(prefix, start)
        if step is None:
            return readout[0], self.params.readout_normal(readout)
        u_perfect = step[0] if choice < self.params.partial_correlation else readout[0]
        return u_perfect, self.params.readout_normal(readout, step)

    def _persistent_score(self, prefix) -> float:
        """The readout's score with its normal chained through the path's earlier steps' (step_persistence) and
        its mean moved by step_drift per earlier step."""
        starts = [i for i, token in enumerate(prefix) if token in self.opener_ids] or [0]
        z = None
        for begin, end in pairwise(starts):
            position = self._score_position(prefix, begin, end)
            if position is not None:
                z = self.params.persist(z, self._draws(prefix[: position + 1], begin)[1])
        u_perfect, fresh = self._draws(prefix, starts[-1])
        return self.params.persistent_score(self.sees_error(prefix), u_perfect, self.params.persist(z, fresh),
                                            len(starts) - 1)

    def _score_position(self, prefix, begin: int, end: int) -> int | None:
        """Where the step opening at `begin` (the next opening at `end`) was scored: its last step tag
        (qwen-math-prm), or the position before its last "+" (rlhflow's assistant turn); None if neither."""
        if self.tag_id is not None:
            return next((i for i in range(end - 1, begin, -1) if prefix[i] == self.tag_id), None)
        return next((i - 1 for i in range(end - 1, begin + 1, -1) if prefix[i] == self.plus_id), None)

    def _step_start(self, prefix: list[int]) -> int:
        """The position of the last step opener in prefix (the step a readout scores); 0 if there is none."""
        return next((i for i in range(len(prefix) - 1, -1, -1) if prefix[i] in self.opener_ids), 0)

    def sees_error(self, prefix: list[int]) -> bool:
        """The path has erred and the PRM noticed its first slip (drawn once per path: from the prefix
        through that slip)."""
        slips = self.tokenizer.slip_ids.intersection(prefix)
        if not slips:
            return False
        first = min(prefix.index(token) for token in slips)
        return unit_interval(prefix_key(self.seed + 1, prefix[: first + 1])) < self.params.detection

    def outputs(self, items: list[tuple[Sequence, int]]) -> torch.Tensor:
        logits = [SURE_LOGIT if s == 1.0 else math.log(s / (1.0 - s))
                  for s in (self.score(seq.token_ids, p) for seq, p in items)]
        if self.head_size == 2:
            out = torch.zeros((len(items), 2))
            out[:, 1] = torch.tensor(logits)
            return out  # [R, 2]: softmax(.)[1] = score
        out = torch.zeros((len(items), self.head_size))
        out[:, self.plus_id] = torch.tensor(logits)
        return out  # [R, vocab]: softmax over ("+", "-") = (score, 1 - score)


def opener_ids(tokenizer: SyntheticTokenizer) -> frozenset[int]:
    """Every token that opens a step (sound, slip and final openers, with and without their leading space)."""
    spaced = [*tokenizer.good_openers, *tokenizer.slip_openers, tokenizer.final_good, tokenizer.final_slip]
    bare = [tokenizer.token_to_id(tokenizer.text(i)[1:]) for i in spaced]
    return frozenset(spaced + [i for i in bare if i is not None])
