"""Early-pruning policies (docs/design.md, "Early pruning").

A pruning policy is a class with the hooks `Search` calls; `SearchConfig.pruning` names it, and each class
registers under its name in `PRUNING` (`search/registry.py`), so a new pruning variant is one class here plus
one preset line. Each hook takes the calling search as a `SearchOps` (`search/ops.py`) and returns the
candidates to cancel (with their subtrees):

- `after_score(search, c)`: candidate c's score arrived;
- `after_decision(search, rd)`: the round before rd was decided (rd's candidates are now certain).

- none: nothing is cancelled before its round is decided;
- strict: tau = the k-th best score among candidates certain to be in the round's pool; a candidate
  strictly below tau is cancelled with its subtree. It never changes what is retained (`ep-strict` keeps
  exactly what `beam` keeps, ties and exact 1.0 scores included). Below tau means below the lowest score the
  retention policy may keep (`search/retention.py` `lowest_kept`: tau itself by score, tau less the margin
  with KV-aware retention);
- strict_ties: strict, and a candidate tied with the k-th best is cancelled too when k certain copies rank
  before it in the order selection breaks ties by (score, then tree position); it still retains exactly what
  `beam` retains, and prunes the ties strict keeps (exact 1.0 scores: docs/design.md, "Early pruning"); with a
  retention other than by score (which breaks ties by its own order) it is strict.

The perfect-score shortcut (a separate switch, `SearchConfig.perfect_shortcut`, registered in `SHORTCUT` as
"on" and "off") is `PerfectShortcut`, whose hook `closes(rd)` `Search` asks before deciding a round: k certain
candidates scoring exactly 1.0 close the round at once (the first verified win); rounds may then retain other
paths than beam would (`ep`).
"""

from __future__ import annotations

from specscale.config import SearchConfig
from specscale.search import policies
from specscale.search.ops import SearchOps
from specscale.search.registry import OFF, ON, Registry
from specscale.search.retention import RETENTION, ScoreRetention
from specscale.search.tree import Candidate, CandidateState, Round

PRUNING: Registry[NoPruning] = Registry("pruning")
SHORTCUT: Registry[NoShortcut] = Registry("perfect_shortcut", switch=True)


@PRUNING.register("none")
class NoPruning:
    """Nothing is cancelled before its round is decided."""

    def __init__(self, config: SearchConfig):
        self.config = config
        self.k = config.num_retained
        self.retention = RETENTION.chosen(config)(config)  # the lowest score a round may still retain

    def after_score(self, search: SearchOps, c: Candidate) -> list[Candidate]:
        return []

    def after_decision(self, search: SearchOps, rd: Round) -> list[Candidate]:
        return []


@PRUNING.register("strict")
class StrictPruning(NoPruning):
    def after_score(self, search: SearchOps, c: Candidate) -> list[Candidate]:
        """Only the round being decided holds candidates certain to be in its pool (their parents are decided)."""
        return self.losers(search.rounds[c.round]) if c.round == search.last_decided + 1 else []

    def after_decision(self, search: SearchOps, rd: Round) -> list[Candidate]:
        return self.losers(rd)

    def losers(self, rd: Round) -> list[Candidate]:
        """The round's verified candidates that can never be retained: strictly below tau."""
        scored = _competing(rd)
        distinct = self.config.filter_duplicates
        eligible = policies.distinct_paths(scored) if distinct else scored
        tau = policies.strict_threshold(eligible, self.k, distinct)  # every one of them is certain: parents decided
        return [] if tau is None else [c for c in scored if c.score < self.retention.lowest_kept(tau)]


@PRUNING.register("strict_ties")
class TiedStrictPruning(StrictPruning):
    """Selection ranks logical copies by score, then by tree position (`policies.top_k_copies`): a candidate
    whose best copy has k certain copies ranked before it can never be retained, even when tied with the
    k-th best. With `filter_duplicates` a path's copies compete as one and the strict rule applies unchanged."""

    def losers(self, rd: Round) -> list[Candidate]:
        if self.config.filter_duplicates or type(self.retention) is not ScoreRetention:
            return super().losers(rd)
        scored = _competing(rd)
        if sum(c.multiplicity for c in scored) < self.k:
            return []
        copies = sorted((-c.score, key) for c in scored for key in c.lane_keys)
        kth = copies[self.k - 1]  # the k-th certain copy: a candidate whose best copy ranks after it is out
        return [c for c in scored if (-c.score, min(c.lane_keys)) > kth]


def _competing(rd: Round) -> list[Candidate]:
    """The round's verified candidates that compete for retention (completed ones go to the finished pool)."""
    return [c for c in rd.live_candidates() if c.state == CandidateState.SCORED and not c.completed]


@SHORTCUT.register(OFF)
class NoShortcut:
    """Every round waits for its candidates' scores."""

    def __init__(self, config: SearchConfig):
        self.k = config.num_retained

    def closes(self, rd: Round) -> list[tuple[Candidate, int]] | None:
        """The copies that close round rd at once (retained, the rest of the round cancelled), or None."""
        return None


@SHORTCUT.register(ON)
class PerfectShortcut(NoShortcut):
    def closes(self, rd: Round) -> list[tuple[Candidate, int]] | None:
        """k certain copies scoring exactly 1.0: the first verified win."""
        perfect = [c for c in _competing(rd) if c.score >= 1.0]
        if sum(c.multiplicity for c in perfect) < self.k:
            return None
        chosen, left = [], self.k
        for c in sorted(perfect, key=lambda c: c.verified_order):
            if left:
                chosen.append((c, min(c.multiplicity, left)))
                left -= chosen[-1][1]
        return chosen

