"""Speculation policies: what a search generates before a round is decided (docs/design.md, "Speculation").

- none: children are generated once their parent is retained (beam search, best-of-N, DVTS);
- eager: a verified candidate is expanded at once, up to `depth` rounds ahead of the last decided round, at
  lower priority; when its round is decided the losers' subtrees are cancelled (naive-spec, EP, SpecScale);
- lookahead: FastTTS's Speculative Beam Extension: a step that finished while its round is still generating
  keeps decoding its next step (sampled as the step was, as FastTTS's engine does) at the lowest priority,
  paused when the round ends and scored with the round if it finished; when its parent is
  retained the continuation becomes a child and every other child starts from its text, truncated
  (`lookahead_head_start`); a per-request valve (`max_live_sequences`) force-finishes the oldest ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.config import SearchConfig


@dataclass(frozen=True)
class Speculation:
    eager_depth: int  # rounds a verified candidate may be expanded ahead of the last decided one (0: never)
    lookahead: bool

    def expands_early(self, round_index: int, last_decided: int) -> bool:
        """May a verified candidate of `round_index` get its children before its round is decided?"""
        return round_index + 1 - (last_decided + 1) <= self.eager_depth and self.eager_depth > 0


def make_speculation(config: SearchConfig) -> Speculation:
    return Speculation(config.speculation_depth if config.speculative else 0, config.lookahead)
