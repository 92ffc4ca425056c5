"""A search's policies, built from its `SearchConfig` (docs/design.md, "Search semantics").

Each kind is a registry (`search/registry.py`) of classes, built the same way: the class the config's field
names, constructed with the config. Building them checks every name: an unknown one is a `ValueError` naming
the field and the valid names (`preset_config` builds them for that, and so does every `Search`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.config import SearchConfig
from specscale.search.dedup import DEDUP, OneExpansionPerChild
from specscale.search.early_exit import EXIT, NoExit
from specscale.search.lookahead import LOOKAHEAD, NoLookahead
from specscale.search.partial_rejection import PARTIAL, NoPartialRejection
from specscale.search.pruning import PRUNING, SHORTCUT, NoPruning, NoShortcut
from specscale.search.selection import SELECTION, Selection
from specscale.search.speculation import SPECULATION, NoSpeculation
from specscale.search.verification import VERIFICATION, Verification


@dataclass(frozen=True)
class Policies:
    """The policy objects a search is composed of, one per kind."""

    selection: Selection
    verification: Verification
    speculation: NoSpeculation
    lookahead: NoLookahead
    pruning: NoPruning
    shortcut: NoShortcut
    dedup: OneExpansionPerChild
    exit: NoExit
    partial: NoPartialRejection


def build_policies(config: SearchConfig) -> Policies:
    """The policies config names (a ValueError naming the field if one is not registered)."""
    return Policies(
        selection=SELECTION.chosen(config)(config),
        verification=VERIFICATION.chosen(config)(config),
        speculation=SPECULATION.chosen(config)(config),
        lookahead=LOOKAHEAD.chosen(config)(config),
        pruning=PRUNING.chosen(config)(config),
        shortcut=SHORTCUT.chosen(config)(config),
        dedup=DEDUP.chosen(config)(config),
        exit=EXIT.chosen(config)(config),
        partial=PARTIAL.chosen(config)(config),
    )
