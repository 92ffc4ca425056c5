"""Speculation policies: what a search generates before a round is decided (docs/design.md, "Speculation").

A policy is a class with the hooks `Search` calls; `SearchConfig.speculation` names it, and each class
registers under its name in `SPECULATION` (`search/registry.py`), so a new speculation variant is one class
here plus one preset line. Each hook takes the calling search as a `SearchOps` (`search/ops.py`):

- `on_scored(search, c, time)`: a candidate's score arrived (after pruning): the actions it starts;
- `on_round_decided(search, time)`: a round was decided and its winners' children reconciled;
- `priority(search, e)`: the engine priority of expansion e (higher runs first).

- none: children are generated once their parent is retained (beam search, best-of-N, DVTS);
- eager: a verified candidate is expanded at once, up to `speculation_depth` rounds ahead of the last decided
  round, at lower priority, ranked inside its depth's band by its parent's survival rank
  (`rank_speculation`); when its round is decided the losers' subtrees are cancelled (naive-spec, EP,
  SpecScale);
- eager_unbounded: eager, with the speculative children at real work's priority, so the engine admits them like
  any other row, bounded only by `speculation_depth` and its own capacity (no row budget, no ranking): the paper's
  naive speculation (`naive-spec-unbounded`), beside `naive-spec`'s bounded form.
FastTTS's Speculative Beam Extension (LookAhead) is its own policy, in `search/lookahead.py`.
"""

from __future__ import annotations

from specscale.config import SearchConfig
from specscale.search.ops import SearchOps
from specscale.search.protocol import Action
from specscale.search.registry import Registry
from specscale.search.tree import Candidate, CandidateState, Expansion, Round

# Engine priorities (higher runs first; docs/design.md, "Speculation"): 0 for real work; speculation d rounds
# ahead in the band -d * SPECULATION_BAND - (0 .. SPECULATION_BAND - 1), ranked inside it by its parent's
# chance to be retained; FastTTS's LookAhead continuations below every band (search/lookahead.py).
SPECULATION_BAND = 100

SPECULATION: Registry[NoSpeculation] = Registry("speculation")


@SPECULATION.register("none")
class NoSpeculation:
    """Children only once their parent is retained: every hook does nothing, all work runs at priority 0."""

    def __init__(self, config: SearchConfig):
        self.config = config

    @property
    def eager_depth(self) -> int:
        """Rounds a verified candidate may be expanded ahead of the last decided one (0: never)."""
        return 0

    def on_scored(self, search: SearchOps, c: Candidate, time: float) -> list[Action]:
        return []

    def on_round_decided(self, search: SearchOps, time: float) -> list[Action]:
        return []

    def priority(self, search: SearchOps, e: Expansion) -> int:
        return 0  # nothing runs ahead of the round being decided


@SPECULATION.register("eager")
class EagerSpeculation(NoSpeculation):
    @property
    def eager_depth(self) -> int:
        return self.config.speculation_depth

    def on_scored(self, search: SearchOps, c: Candidate, time: float) -> list[Action]:
        """Expand the verified candidate now if it may run ahead; then re-rank its round's speculative
        children, whose parents' standing the score changed."""
        actions = self._speculate(search, c, time) if c.alive and not c.completed else []
        if self.config.rank_speculation:
            actions += self._rerank(search, search.rounds[c.round])
        return actions

    def on_round_decided(self, search: SearchOps, time: float) -> list[Action]:
        """The undecided rounds' verified candidates that may now run ahead (one round more is allowed)."""
        actions = []
        for rd in search.rounds[search.last_decided + 1:]:
            for c in rd.live_candidates():
                if c.state == CandidateState.SCORED and not c.completed:
                    actions += self._speculate(search, c, time)
        return actions

    def priority(self, search: SearchOps, e: Expansion) -> int:
        """0 for real work; for speculation d rounds ahead of the round being decided, the band of depth d,
        ranked by the parent's survival rank (so the engine's spare rows go to the likeliest survivors)."""
        depth = max(e.round - (search.last_decided + 1), 0)
        if depth == 0:
            return 0
        rank = survival_rank(search, e.parent) if self.config.rank_speculation else 0
        return -depth * SPECULATION_BAND - min(rank, SPECULATION_BAND - 1)

    def may_expand(self, search: SearchOps, c: Candidate) -> bool:
        """May verified candidate c get its children before its round is decided?"""
        ahead = c.round + 1 - (search.last_decided + 1)
        return ahead <= self.eager_depth

    def _speculate(self, search: SearchOps, c: Candidate, time: float) -> list[Action]:
        if c.children or c.round >= search.last_round or not self.may_expand(search, c):
            return []
        width = range(self.config.beam_width)
        return search.expand(c, c.round + 1, [key + (i,) for key in c.lane_keys for i in width], time)

    def _rerank(self, search: SearchOps, rd: Round) -> list[Action]:
        """A score arrived in round rd: re-rank the live speculative children of its candidates."""
        if rd.index + 1 >= len(search.rounds):
            return []
        return search.reprioritize(search.rounds[rd.index + 1].expansions)



@SPECULATION.register("eager_unbounded")
class UnboundedEagerSpeculation(EagerSpeculation):
    """Eager speculation whose children run at priority 0, like the round being decided: the engine's row budget
    (which bounds only priorities below 0) never applies to them."""

    def priority(self, search: SearchOps, e: Expansion) -> int:
        return 0

def survival_rank(search: SearchOps, parent: Candidate) -> int:
    """Logical copies of the parent's round, verified so far, that score strictly above the parent: below
    k it is inside the round's top k so far (EP's threshold compares it with the k-th best)."""
    verified = [c for c in search.rounds[parent.round].live_candidates()
                if c.state == CandidateState.SCORED and not c.completed]
    return sum(c.multiplicity for c in verified if c.score > parent.score)

