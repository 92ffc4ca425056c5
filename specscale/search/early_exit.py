"""Early-exit policies: end a search before selection would (docs/design.md, "Early exit"; issue 46, point 2).

`SearchConfig.early_exit` names one; each class registers under its name in `EXIT` (`search/registry.py`).
`Search` asks its exit policy after every score arrives (`after_score`) and after every round is decided
(`after_decision`), handing it the finished pool (the completed paths so far, which `SearchOps` does not show);
an `Exit` ends the search at once: what was generating is cancelled, the rows and KV are released (so the
runtime admits the next request), and the result is an `ExitedResult` whose `early_exit` names the rule.

The answer a search returns (`SearchResult.answer`, `specscale/answers.py`) is its best path's: the top of the
finished pool, ranked by score then tree position (`policies.top_k_copies`). Every score is at most 1.0 (a PRM
reads out probabilities; every aggregation of them stays in [0, 1]). So a completed path L is the final best
path, whatever is still to come, when every path that may still complete — a candidate alive, a lane still
generating, and everything below them — can at most tie L at 1.0 and would lose the tie on tree position:
L scores exactly 1.0 and every such path's key is above L's. Below 1.0 nothing is ever settled (any running
path may still finish at 1.0 with another answer), which is why the exact rule fires only on perfect scores.

- none: no early exit;
- exact: the positive exit above; it returns exactly the path (so the answer) the same search without it
  returns, on every problem and seed (`tests/test_early_exit.py`);
- certain: the soft positive exit: the leader scores at least `exit_certainty` and ranks above what every
  path still running scores now (a candidate's own score, or its parent's while its step generates; 1.0 for
  a first step with nothing scored above it); not exact;
- stall: the negative exit: the best running (retained) path's score has not risen above the best of the
  earlier rounds for `exit_stall_rounds` decided rounds and lies below `exit_floor`; the search ends with its
  completed paths, or with its retained running paths when none has completed;
- exact+stall, certain+stall: both.
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.config import SearchConfig
from specscale.search.ops import SearchOps
from specscale.search.registry import Registry
from specscale.search.result import SearchResult
from specscale.search.tree import Candidate, CandidateState, Key

EXIT: Registry[NoExit] = Registry("early_exit")
SCORE_BOUND = 1.0  # no path scores more (PRM probabilities; every aggregation of them)
SETTLED, CERTAIN, STALLED = "settled", "certain", "stalled"  # ExitedResult.early_exit


@dataclass(frozen=True)
class Exit:
    """End the search now. reason: SETTLED (exact positive exit), CERTAIN (soft) or STALLED (negative);
    pooled: running candidates that join the finished pool first (a stalled search with no completed path)."""

    reason: str
    pooled: tuple[Candidate, ...] = ()


@dataclass
class ExitedResult(SearchResult):
    """The result of a search an exit policy ended: `early_exit` says which rule (SETTLED, CERTAIN, STALLED).
    A subclass, so the results of searches that run to their end are unchanged."""

    early_exit: str = ""


def exited(result: SearchResult, reason: str) -> ExitedResult:
    fields = {name: getattr(result, name) for name in SearchResult.__dataclass_fields__}
    return ExitedResult(**fields, early_exit=reason)


@dataclass(frozen=True)
class Rival:
    """A path that may still join the finished pool: the most it may score and the lowest tree position it
    may have (ties go to the lower key, as selection breaks them)."""

    bound: float
    key: Key


@EXIT.register("none")
class NoExit:
    """Searches run until their selection ends them."""

    def __init__(self, config: SearchConfig):
        self.config = config

    def after_score(self, search: SearchOps, pool: list[Candidate]) -> Exit | None:
        """A score arrived (pool: the finished pool)."""
        return None

    def after_decision(self, search: SearchOps, pool: list[Candidate],
                       retained: list[tuple[Candidate, int]]) -> Exit | None:
        """A round (search.last_decided) was decided and does not end the search; retained: what it keeps."""
        return None


@EXIT.register("exact")
class ExactExit(NoExit):
    """The best completed path can no longer be overtaken."""

    reason = SETTLED

    def after_score(self, search: SearchOps, pool: list[Candidate]) -> Exit | None:
        found = super().after_score(search, pool)
        if found is not None:
            return found
        nxt = search.last_decided + 1
        certain = self._certain(search, nxt)
        rivals = self._rivals(search, nxt, [], exclude=set(certain))
        return self._check(pool + certain, rivals, tuple(certain))

    def after_decision(self, search: SearchOps, pool: list[Candidate],
                       retained: list[tuple[Candidate, int]]) -> Exit | None:
        found = super().after_decision(search, pool, retained)
        if found is not None:
            return found
        rivals = self._rivals(search, search.last_decided + 1, [c for c, _ in retained], exclude=set())
        return self._check(pool, rivals)

    def _check(self, settled: list[Candidate], rivals: list[Rival], pooled: tuple[Candidate, ...] = ()) -> Exit | None:
        """Exit when the best of the settled paths leads every rival (pooled: settled paths not in the pool yet)."""
        if not settled:
            return None
        leader = min(settled, key=_rank)
        if not self._leads(leader, rivals):
            return None
        return Exit(self.reason, pooled)

    def _leads(self, leader: Candidate, rivals: list[Rival]) -> bool:
        """Whether no rival can rank above the leader (score first, then the lower key)."""
        mine = _rank(leader)
        return all(mine < (-r.bound, r.key) for r in rivals)

    def _certain(self, search: SearchOps, nxt: int) -> list[Candidate]:
        """The completed, scored candidates of the round being decided: beam's selection pools every one of
        them (DVTS may not: a subtree's best decides), so they count as finished already."""
        if self.config.selection not in ("beam", "best_of_n") or nxt >= len(search.rounds):
            return []
        return [c for c in search.rounds[nxt].candidates
                if c.alive and c.completed and c.state == CandidateState.SCORED and c.score is not None]

    def _rivals(self, search: SearchOps, first: int, running: list[Candidate], exclude: set) -> list[Rival]:
        """Every path that may still complete: the given running candidates, every candidate alive in rounds
        from `first` on, and every lane still wanted there (a step generating, or not begun)."""
        rivals = [self._rival(c) for c in running]
        for rd in search.rounds[first:]:
            rivals += [self._rival(c) for c in rd.candidates if c.alive and c not in exclude]
            for e in rd.expansions:
                if not e.cancelled:
                    rivals += [Rival(self._estimate(e.parent), e.child_keys[j] + (0,)) for j in e.pending & e.kept]
        return rivals

    def _rival(self, c: Candidate) -> Rival:
        if c.completed and c.state == CandidateState.SCORED and c.score is not None:
            return Rival(c.score, min(c.lane_keys))  # finished with its score: it joins with exactly that
        return Rival(self._bound(c), min(c.lane_keys))

    def _bound(self, c: Candidate) -> float:
        """The most a running candidate's completed descendants may score."""
        return SCORE_BOUND

    def _estimate(self, parent: Candidate | None) -> float:
        """The most a step still generating below parent may score."""
        return SCORE_BOUND


@EXIT.register("certain")
class CertainExit(ExactExit):
    """Soft: the leader scores at least `exit_certainty` and ranks above every running path's current score."""

    reason = CERTAIN

    def _leads(self, leader: Candidate, rivals: list[Rival]) -> bool:
        return leader.score is not None and leader.score >= self.config.exit_certainty and super()._leads(
            leader, rivals)

    def _bound(self, c: Candidate) -> float:
        if c.score is not None:
            return c.score
        return self._estimate(c.parent)

    def _estimate(self, parent: Candidate | None) -> float:
        return parent.score if parent is not None and parent.score is not None else SCORE_BOUND


@EXIT.register("stall")
class StallExit(NoExit):
    """Negative: the best retained path's score has not risen for `exit_stall_rounds` decided rounds and is below
    `exit_floor` (completed paths do not count: a search that completed a path at 1.0 may still be stuck below)."""

    def __init__(self, config: SearchConfig):
        super().__init__(config)
        self.best = -1.0
        self.flat_rounds = 0

    def after_decision(self, search: SearchOps, pool: list[Candidate],
                       retained: list[tuple[Candidate, int]]) -> Exit | None:
        found = super().after_decision(search, pool, retained)
        if found is not None:
            return found
        best = max((c.score for c, _ in retained if c.score is not None), default=-1.0)
        if best > self.best:
            self.best, self.flat_rounds = best, 0
        else:
            self.flat_rounds += 1
        if self.flat_rounds < self.config.exit_stall_rounds or best >= self.config.exit_floor:
            return None
        return Exit(STALLED, () if pool else tuple(c for c, _ in retained))


@EXIT.register("exact+stall")
class ExactStallExit(StallExit, ExactExit):
    """exact, and stall after a decision that did not settle the answer."""


@EXIT.register("certain+stall")
class CertainStallExit(StallExit, CertainExit):
    """certain, and stall after a decision that did not settle the answer."""


def _rank(c: Candidate) -> tuple[float, Key]:
    """Selection's order of a completed path's best copy: higher score first, then the lower tree position."""
    return (-(c.score if c.score is not None else 0.0), min(c.lane_keys))
