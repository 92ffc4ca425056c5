"""The search tree: expansions (a parent's children being generated) and candidates (finished steps).

A logical path is a candidate plus its ancestors. With computation deduplication one candidate can
stand for several identical logical candidates (its multiplicity); without it, multiplicity is 1.
Each node has a canonical key — its position in the tree (parent key + child index) — which does
not depend on timing, so ties are broken the same way by every variant.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from specscale.search.protocol import StartFrom


class CandidateState(enum.Enum):
    FINISHED = "finished"  # step done, not yet scored
    SCORED = "scored"
    RETAINED = "retained"  # its round is decided and it keeps >= 1 copy
    COMPLETED = "completed"  # in the finished pool (a completed path)
    DROPPED = "dropped"  # not retained, pruned, cancelled or discarded


Key = tuple[int, ...]


@dataclass(eq=False)
class Expansion:
    """Logical children of `parent` (None = the prompt), generated as one step: one lane per child, lane j
    being the child at tree position child_keys[j] and sampling from that position's seed (docs/design.md,
    "Seeds"). Plain search has one lane per expansion; CD puts all children of one parent in one.

    When its parent ends up with fewer children than were speculatively started, the lanes whose keys
    are no longer wanted leave `kept`: finishing pieces keep only their kept lanes, so the surviving
    children are exactly those plain search would have kept.
    """

    id: int
    parent: Candidate | None
    round: int
    child_keys: tuple[Key, ...]
    seeds: tuple[int, ...] | None  # one per lane (search/seeds.py)
    created_at: float
    lookahead: bool = False  # a LookAhead continuation running ahead of its round (the lookahead policy's state)
    start_from: StartFrom | None = None  # what it starts from other than its parent's end (the lookahead policy's)
    started_as_lookahead: bool = False  # FastTTS: began as a LookAhead continuation (lookahead may end)
    priority: int = 0
    paused: bool = False
    pending: set[int] = field(default_factory=set)  # lanes still generating
    kept: set[int] = field(default_factory=set)  # lanes whose children are still wanted
    cancelled: bool = False
    finished: list[Candidate] = field(default_factory=list)  # its pieces that finished, in order

    def __post_init__(self) -> None:
        self.pending = set(range(len(self.child_keys)))
        self.kept = set(self.pending)

    @property
    def key(self) -> Key:
        return self.child_keys[0]

    @property
    def multiplicity(self) -> int:
        """Logical children it stands for: its kept lanes."""
        return len(self.kept)

    @property
    def remaining(self) -> int:
        return len(self.pending)

    @property
    def keep_left(self) -> int:
        """Lanes still generating whose children are wanted."""
        return len(self.pending & self.kept)

    @property
    def live(self) -> bool:
        return not self.cancelled and self.remaining > 0


@dataclass(eq=False)
class Candidate:
    """A finished step standing for `multiplicity` logical candidates: lanes `lanes` of its expansion, each
    at tree position child_key + (0,). Its key (ties, DVTS groups) is its first lane's."""

    id: int
    handle: int | None  # physical sequence holding the step's KV (None once freed or completed)
    expansion: Expansion
    lanes: tuple[int, ...]
    text: str
    num_tokens: int
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
    finish_reason: str = "stop"  # "length": its step was cut by the step token cap or the context limit
    score_error: str | None = None  # why the PRM did not score every step (e.g. past its context)

    @property
    def lane_keys(self) -> tuple[Key, ...]:
        """The tree positions of the logical candidates it stands for, in order."""
        return tuple(self.expansion.child_keys[j] + (0,) for j in self.lanes)

    @property
    def key(self) -> Key:
        return self.lane_keys[0]

    @property
    def multiplicity(self) -> int:
        return len(self.lanes)

    @property
    def round(self) -> int:
        return self.expansion.round

    @property
    def parent(self) -> Candidate | None:
        return self.expansion.parent

    @property
    def alive(self) -> bool:
        return self.state in (CandidateState.FINISHED, CandidateState.SCORED, CandidateState.RETAINED)

    def steps(self) -> list[str]:
        """Step texts of the path, root first."""
        texts: list[str] = []
        node: Candidate | None = self
        while node is not None:
            texts.append(node.text)
            node = node.parent
        return texts[::-1]

    def path_tokens(self) -> int:
        total = 0
        node: Candidate | None = self
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
