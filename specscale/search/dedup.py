"""Deduplication policies (docs/design.md, "Computation deduplication" and "Duplicate filtering").

- computation: a parent's children are one expansion, one engine row per distinct prefix; each logical
  child keeps its own seed (a lane), so given equal logits it changes only the cost (CD);
- filter_duplicates: identical paths compete as one in selection (search-and-learn's option).
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.config import SearchConfig

Key = tuple[int, ...]


@dataclass(frozen=True)
class Dedup:
    computation: bool
    filter_duplicates: bool

    def expansions(self, child_keys: list[Key]) -> list[tuple[Key, ...]]:
        """The children at these tree positions, grouped into expansions."""
        return [tuple(child_keys)] if self.computation else [(key,) for key in child_keys]


def make_dedup(config: SearchConfig) -> Dedup:
    return Dedup(config.dedup, config.filter_duplicates)
