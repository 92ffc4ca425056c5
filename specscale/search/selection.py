"""Selection policies: how a decided round's candidates become completed paths, the retained set and its
children, and when the search ends (docs/design.md, "Selection"). A preset names one; the search state
machine (`search/search.py`) applies its verdict. `SearchConfig.selection` names one: each class registers under
its name in `SELECTION` (`search/registry.py`).

- `BeamSelection`: search-and-learn's beam search. Completed candidates go to the finished pool; of the
  others the k = N / M best logical copies are retained and the N children are spread over them
  (cyclically, or by FastTTS's dynamic branching); the search ends once the pool holds N paths, nothing
  is left to continue, or the last round (generated to EOS) is decided. With `filter_duplicates`
  (search-and-learn's option, off by default) identical paths compete as one logical copy, so fewer
  than k distinct paths may be retained and they share the N children. Which k copies are retained is its
  retention policy's (`search/retention.py`, `SearchConfig.retention`): by score, or KV-aware.
- `BestOfNSelection`: N whole solutions in one round (the last round is round 0).
- `DVTSSelection`: search-and-learn's diverse verifier tree search. The N root children form N / M
  subtrees of M; per subtree the best candidate of the round, completed ones included, is kept and gets
  M children; a subtree whose best candidate completed its path (or holds a ``\\boxed{``) ends, and all of
  its round's candidates are its result; the search ends when every subtree has ended or at the round cap.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from specscale.config import SearchConfig
from specscale.search import policies
from specscale.search.branching import BRANCHING_SCORES, dynamic_children
from specscale.search.registry import Registry
from specscale.search.retention import RETENTION
from specscale.search.tree import Candidate

BOXED = "boxed{"


@dataclass
class Verdict:
    """What a decided round does: paths that complete, copies retained (best first), candidates dropped,
    and whether the search ends here."""

    completed: list[Candidate] = field(default_factory=list)
    retained: list[tuple[Candidate, int]] = field(default_factory=list)
    dropped: list[Candidate] = field(default_factory=list)
    done: bool = False


SELECTION: Registry[Selection] = Registry("selection")


class Selection(ABC):
    """The seam between the search state machine and a selection rule."""

    def __init__(self, config: SearchConfig):
        self.config = config
        self.k = config.num_retained
        self.retention = RETENTION.chosen(config)(config)  # which k copies a beam round keeps

    def last_round(self) -> int:
        """The round that generates to EOS."""
        return self.config.max_rounds - 1

    @abstractmethod
    def decide(self, live: list[Candidate], pool: list[Candidate], last: bool) -> Verdict:
        """The verdict on a round's live (scored) candidates, given the finished pool so far."""

    @abstractmethod
    def children(self, retained: list[tuple[Candidate, int]]) -> list[int]:
        """Children per retained logical copy, copies in the order of `retained`."""


@SELECTION.register("beam")
class BeamSelection(Selection):
    def decide(self, live: list[Candidate], pool: list[Candidate], last: bool) -> Verdict:
        completed = [c for c in live if c.completed]
        active = [c for c in live if not c.completed]
        pooled = sum(c.multiplicity for c in pool + completed)
        if last or not active or pooled >= self.config.beam_size:
            return Verdict(completed, [], active, done=True)
        eligible = policies.distinct_paths(active) if self.config.filter_duplicates else active
        retained = self.retention.retain(eligible, self.k, one_copy_each=self.config.filter_duplicates)
        kept = {c for c, _ in retained}
        return Verdict(completed, retained, [c for c in active if c not in kept])

    def children(self, retained: list[tuple[Candidate, int]]) -> list[int]:
        if self.config.dynamic_branching:
            return dynamic_children(retained, self.config.beam_size, BRANCHING_SCORES[self.config.branching_score])
        return policies.cyclic_children(retained, self.config.beam_size)


@SELECTION.register("best_of_n")
class BestOfNSelection(BeamSelection):
    def last_round(self) -> int:
        return 0


@SELECTION.register("dvts")
class DVTSSelection(Selection):
    def decide(self, live: list[Candidate], pool: list[Candidate], last: bool) -> Verdict:
        verdict = Verdict()
        for _, members in sorted(self._subtrees(live).items()):
            best, _ = policies.top_k_copies(members, 1)[0]
            if last or best.completed or BOXED in "".join(best.steps()):
                verdict.completed += members  # the subtree ends: its round's candidates are its result
            else:
                verdict.retained.append((best, 1))
                verdict.dropped += [c for c in members if c is not best]
        verdict.done = not verdict.retained
        return verdict

    def _subtrees(self, live: list[Candidate]) -> dict[int, list[Candidate]]:
        """Candidates by subtree: root child i belongs to subtree i // M, and so does its whole line."""
        groups: dict[int, list[Candidate]] = {}
        for c in live:
            groups.setdefault(c.key[0] // self.config.beam_width, []).append(c)
        return groups

    def children(self, retained: list[tuple[Candidate, int]]) -> list[int]:
        return [self.config.beam_width for _, copies in retained for _ in range(copies)]

