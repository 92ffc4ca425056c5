"""Early-pruning policies (docs/design.md, "Early pruning").

- strict: tau = the k-th best score among candidates certain to be in the round's pool; a candidate
  strictly below tau is cancelled with its subtree. It never changes what is retained (`ep-strict` keeps
  exactly what `beam` keeps, ties and exact 1.0 scores included).
- perfect_shortcut: k certain candidates scoring exactly 1.0 close the round at once (the first verified
  win); rounds may then retain other paths than beam would (`ep`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.config import SearchConfig


@dataclass(frozen=True)
class Pruning:
    strict: bool
    perfect_shortcut: bool


def make_pruning(config: SearchConfig) -> Pruning:
    return Pruning(config.prune_strict, config.perfect_shortcut)
