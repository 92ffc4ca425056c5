"""The search as its policies see it: `SearchOps`, the one typed interface between `Search` and its policies.

Every policy hook takes the calling search as a `SearchOps` (docs/design.md, "Search semantics"): what it may
read (the config, the rounds, the expansions, which round is decided and which is the last) and the
operations it may ask for (start children, verify a step or a round, re-rank expansions). `Search`
(`search/search.py`) implements it; no policy reaches past it into the search's private methods
(`tests/test_search_ops.py` checks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from specscale.config import SearchConfig
from specscale.search.protocol import Action, Expand, Verify
from specscale.search.tree import Candidate, Expansion, Key, Round


class SearchOps(Protocol):
    @property
    def config(self) -> SearchConfig: ...

    @property
    def rounds(self) -> list[Round]:
        """Every round started so far, by index."""

    @property
    def expansions(self) -> Mapping[int, Expansion]:
        """Every expansion started so far, by id."""

    @property
    def last_decided(self) -> int:
        """The index of the last decided round (-1 before the first is decided)."""

    @property
    def last_round(self) -> int:
        """The round that generates to EOS."""

    def expand(self, parent: Candidate | None, round_index: int, child_keys: list[Key], time: float) -> list[Action]:
        """Start the logical children of parent at tree positions child_keys (grouped into expansions by the
        dedup policy), at the priority the policies give them: their Expand actions."""

    def new_expansion(self, parent: Candidate | None, round_index: int, child_keys: tuple[Key, ...], time: float,
                      lookahead: bool = False) -> Expansion:
        """One expansion of these children, added to the tree (lookahead: a continuation running ahead of its
        round, which the lookahead policy ranks); `expand_action` starts it."""

    def expand_action(self, e: Expansion) -> Expand:
        """The Expand action that starts expansion e."""

    def verify(self, c: Candidate, completes_group: bool) -> Verify:
        """Send candidate c's path to the PRM (completes_group: its sibling group has finished its step)."""

    def verify_round(self, rd: Round) -> list[Action]:
        """Send round rd's unverified candidates (and what the lookahead policy verifies with them) at once."""

    def new_id(self) -> int:
        """A fresh id, unused by any expansion or candidate (a partial readout's)."""

    def stop_lanes(self, e: Expansion, lanes: tuple[int, ...], handle: int, time: float) -> list[Action]:
        """Stop lanes of e that sequence `handle` is still generating: their sequence is aborted (its KV freed)
        and the round goes on without them (partial rejection)."""

    def group_complete(self, e: Expansion) -> bool:
        """Whether e's group (its siblings, or its round with `lv_group="round"`) has finished its step."""

    def reprioritize(self, expansions: Iterable[Expansion] | None = None) -> list[Action]:
        """SetPriority actions for the live expansions (default: all) whose priority changed."""
