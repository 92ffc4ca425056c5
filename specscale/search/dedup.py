"""Deduplication policies (docs/design.md, "Computation deduplication" and "Duplicate filtering").

The switch `SearchConfig.dedup` chooses the class registered in `DEDUP` (`search/registry.py`) as "on" or
"off"; `Search` asks it how a parent's logical children are grouped into expansions (`expansions`).

- off: one expansion, one engine row, per logical child;
- on (computation deduplication, CD): a parent's children are one expansion, one engine row per distinct
  prefix; each logical child keeps its own seed (a lane), so given equal logits it changes only the cost.

Search-and-learn's duplicate filtering (`SearchConfig.filter_duplicates`: identical paths compete as one) is
the selection's (`search/selection.py`).
"""

from __future__ import annotations

from specscale.config import SearchConfig
from specscale.search.registry import OFF, ON, Registry
from specscale.search.tree import Key

DEDUP: Registry[OneExpansionPerChild] = Registry("dedup", switch=True)


@DEDUP.register(OFF)
class OneExpansionPerChild:
    def __init__(self, config: SearchConfig):
        self.config = config

    def expansions(self, child_keys: list[Key]) -> list[tuple[Key, ...]]:
        """The children at these tree positions, grouped into expansions."""
        return [(key,) for key in child_keys]


@DEDUP.register(ON)
class ComputationDedup(OneExpansionPerChild):
    def expansions(self, child_keys: list[Key]) -> list[tuple[Key, ...]]:
        return [tuple(child_keys)]
