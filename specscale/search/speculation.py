"""Speculation policies: what a search generates before a round is decided (docs/design.md, "Speculation").

- none: children are generated once their parent is retained (beam search, best-of-N, DVTS);
- eager: a verified candidate is expanded at once, up to `depth` rounds ahead of the last decided round, at
  lower priority; when its round is decided the losers' subtrees are cancelled (naive-spec, EP, SpecScale);
FastTTS's Speculative Beam Extension (LookAhead) is its own policy, in `search/lookahead.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.config import SearchConfig


@dataclass(frozen=True)
class Speculation:
    eager_depth: int  # rounds a verified candidate may be expanded ahead of the last decided one (0: never)

    def expands_early(self, round_index: int, last_decided: int) -> bool:
        """May a verified candidate of `round_index` get its children before its round is decided?"""
        return round_index + 1 - (last_decided + 1) <= self.eager_depth and self.eager_depth > 0


def make_speculation(config: SearchConfig) -> Speculation:
    return Speculation(config.speculation_depth if config.speculative else 0)
