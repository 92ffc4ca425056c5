"""SyntheticPRM: the simulated PRM's readouts, behind the real `Verifier` and its PRM input formats.

The verifier builds each path's PRM input with its format (`verify/formats.py`) from the synthetic
tokenizer, reuses cached step prefixes and asks the engine for readouts at the score positions, exactly as
with a real PRM. At a score position the synthetic PRM reads whether the path has erred by then (a slip
opener among the tokens before it), draws the workload's score for that class from a hash of the whole
prefix (so a step's score is a function of its path, whatever batch or cache state scores it); whether
it notices a path's error at all is drawn once per path, from the prefix through its first slip. It
returns a readout whose format's score formula gives back that score:

- qwen-math-prm (2-class score head): logits (0, logit(score)); softmax(...)[1] = score, and logits
  (0, 100) give exactly 1.0 in float32, as a sure bf16 PRM does;
- rlhflow (LM head over the vocabulary): logit(score) at "+" and 0 at "-"; softmax over that pair.
"""

from __future__ import annotations

import math

import torch

from specscale.engine.sequence import Sequence
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


    def score(self, token_ids, position: int) -> float:
        """The score read at `position` of a PRM input (a function of token_ids[:position + 1]); with the
        workload's partial_correlation, part of it is drawn once per step (from the prefix through the step's
        opener), so a readout after part of a step (partial-step rejection) and the one after all of it agree."""
        prefix = token_ids[: position + 1]
        key = prefix_key(self.seed, prefix)
        readout = (unit_interval(key), unit_interval(mix64(key)))
        if self.params.partial_correlation == 0:
            return self.params.score(self.sees_error(prefix), *readout)
        step_key = prefix_key(self.seed + 2, prefix[: self._step_start(prefix) + 1])
        step = (unit_interval(step_key), unit_interval(mix64(step_key)))
        return self.params.readout_score(self.sees_error(prefix), readout, step, unit_interval(mix64(mix64(key))))

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
