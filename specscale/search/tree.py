"""The search tree: expansions (a parent's children being generated) and candidates (finished steps).

A logical path is a candidate plus its ancestors. With computation deduplication one candidate can
stand for several identical logical candidates (its multiplicity); without it, multiplicity is 1.
Each node has a canonical key — its position in the tree (parent key + child index) — which does
not depend on timing, so ties are broken the same way by every variant.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class CandidateState(enum.Enum):
    FINISHED = "finished"  # step done, not yet scored
    SCORED = "scored"
    RETAINED = "retained"  # its round is decided and it keeps >= 1 copy
    COMPLETED = "completed"  # in the finished pool (a completed path)
    DROPPED = "dropped"  # not retained, pruned, cancelled or discarded


@dataclass(eq=False)
class Expansion:
    """`multiplicity` logical children of `parent` (None = the prompt), generated as one step.

    When its parent ends up with fewer children than were speculatively started, keep_left drops
    below remaining and finishing pieces are thinned uniformly at random (hypergeometric draws),
    so the kept copies are still independent samples.
    """

    id: int
    parent: "Candidate | None"
    round: int
    key: tuple[int, ...]
    multiplicity: int
    seed: int | None
    created_at: float
    lookahead: bool = False
    priority: int = 0
    paused: bool = False
    remaining: int = 0  # logical children still generating
    keep_left: int = 0  # of those, how many will be kept (thinning when keep_left < remaining)
    cancelled: bool = False
    finished: list["Candidate"] = field(default_factory=list)  # its pieces that finished, in order

    def __post_init__(self) -> None:
        self.remaining = self.keep_left = self.multiplicity

    @property
    def live(self) -> bool:
        return not self.cancelled and self.remaining > 0


@dataclass(eq=False)
class Candidate:
    id: int
    handle: int | None  # physical sequence holding the step's KV (None once freed or completed)
    expansion: Expansion
    key: tuple[int, ...]
    text: str
    num_tokens: int
    multiplicity: int
    completed: bool
    finished_at: float
    order: int  # global finishing order (first to finish wins perfect-score ties)
    state: CandidateState = CandidateState.FINISHED
    step_scores: tuple[float, ...] = ()
    score: float | None = None
    verified_order: int | None = None
    verify_sent: bool = False
    children: list[Expansion] = field(default_factory=list)
    retained_copies: int = 0
    score_error: str | None = None  # why the PRM did not score every step (e.g. past its context)

    @property
    def round(self) -> int:
        return self.expansion.round

    @property
    def parent(self) -> "Candidate | None":
        return self.expansion.parent

    @property
    def alive(self) -> bool:
        return self.state in (CandidateState.FINISHED, CandidateState.SCORED, CandidateState.RETAINED)

    def steps(self) -> list[str]:
        """Step texts of the path, root first."""
        texts, node = [], self
        while node is not None:
            texts.append(node.text)
            node = node.parent
        return texts[::-1]

    def path_tokens(self) -> int:
        total, node = 0, self
        while node is not None:
            total += node.num_tokens
            node = node.parent
        return total


@dataclass
class Round:
    index: int
    expansions: list[Expansion] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    decided: bool = False
    started_at: float | None = None

    def live_expansions(self) -> list[Expansion]:
        return [e for e in self.expansions if e.live]

    def live_candidates(self) -> list[Candidate]:
        return [c for c in self.candidates if c.alive]


@dataclass
class Subtree:
    """What cancelling part of the tree gathers: expansions still generating, handles holding KV,
    and the ids of the dropped candidates (for their queued verifications)."""

    expansions: list[int] = field(default_factory=list)
    handles: list[int] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)

    def drop_candidate(self, c: Candidate) -> None:
        """Mark c and everything below it dropped."""
        if c.state == CandidateState.DROPPED:
            return
        c.state = CandidateState.DROPPED
        self.candidates.append(c.id)
        if c.handle is not None:
            self.handles.append(c.handle)
            c.handle = None
        for e in c.children:
            self.drop_expansion(e)

    def drop_expansion(self, e: Expansion) -> None:
        """Cancel e (its pieces still generating) and drop every candidate it produced."""
        if not e.cancelled:
            e.cancelled = True
            if e.remaining:
                self.expansions.append(e.id)
        for c in e.finished:
            self.drop_candidate(c)

    @property
    def empty(self) -> bool:
        return not (self.expansions or self.handles or self.candidates)
