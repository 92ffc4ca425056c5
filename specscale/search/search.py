"""One request's search as a state machine: `on(event) -> actions`, sans I/O.

Reference semantics (SPEC 2): round r's candidates each finish one step; the PRM scores them;
completed paths go to the finished pool; of the rest the top k = N / M are retained and each gets
M children, so the next round again has N candidates; stop once N paths completed or after the last
round. Variants switch policies on this one machine (SPEC 3):

- speculative: a verified candidate is expanded at once (up to `speculation_depth` rounds ahead of
  the last decided round); when its round is decided, the losers' descendants are cancelled.
- prune_strict: tau = k-th best score among candidates certain to be in the current round's pool;
  anything strictly below tau is cancelled with its descendants (never changes the retained set).
- perfect_shortcut: k certain candidates at score 1.0 close the round at once.
- dedup: children of one parent are one expansion of multiplicity M; finished steps carry their
  multiplicity, are verified once and count that many times in selection.
- lookahead (FastTTS): a real candidate that finishes keeps decoding its next step at the lowest
  priority; when retained, that continuation becomes one of its children.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from specscale.config import SearchConfig
from specscale.search import policies
from specscale.search.protocol import (
    Cancel, Cancelled, Done, Expand, GenerationLost, Pause, Release, Resume, ScoresArrived, SetPriority,
    StepFinished, Verify,
)
from specscale.search.result import SearchResult, build_result
from specscale.search.tree import Candidate, CandidateState, Expansion, Round, Subtree

LOOKAHEAD_PRIORITY = -100


@dataclass(frozen=True)
class Decision:
    round: int
    retained: tuple[tuple[tuple[str, ...], int], ...]  # (path steps, copies), best first
    finished_candidates: int  # logical candidates of the round (children of retained paths) finished by then
    early: bool  # closed by the perfect-score shortcut
    best_score: float  # aggregated score of the best retained path
SCORED, RETAINED, DROPPED, COMPLETED = (
    CandidateState.SCORED, CandidateState.RETAINED, CandidateState.DROPPED, CandidateState.COMPLETED,
)


class Search:
    def __init__(self, config: SearchConfig):
        self.config = config
        self.k = config.num_retained
        # the round that generates to EOS: best-of-N samples whole solutions in round 0
        self.last_round = 0 if config.selection == "best_of_n" else config.max_rounds - 1
        self.rng = random.Random(config.seed or 0)  # thinning draws only
        self.rounds: list[Round] = []
        self.expansions: dict[int, Expansion] = {}
        self.candidates: dict[int, Candidate] = {}
        self.finished_pool: list[Candidate] = []
        self.last_decided = -1
        self.done = False
        self.result: SearchResult | None = None
        self._ids = itertools.count()
        self._finish_order = itertools.count()
        self._verify_order = itertools.count()
        self.round_waiting: list[tuple[float, float]] = []  # per decided round: (idle, busy) seconds
        self.decisions: list[Decision] = []  # what each decided round retained (tests, tracing)

    # ---- entry points ---------------------------------------------------------------------------
    def start(self, time: float) -> list:
        return self._expand(None, 0, self.config.beam_size, time)

    def on(self, event) -> list:
        if self.done:
            handle = getattr(event, "handle", None)
            return [Release((handle,))] if handle is not None else []
        handlers = {
            StepFinished: self._on_step_finished, ScoresArrived: self._on_scores,
            GenerationLost: self._on_lost, Cancelled: self._on_cancelled,
        }
        handler = handlers.get(type(event))
        return handler(event) if handler else []

    # ---- events ---------------------------------------------------------------------------------
    def _on_step_finished(self, ev: StepFinished) -> list:
        e = self.expansions[ev.expansion_id]
        if e.cancelled:
            return [Release((ev.handle,))] if ev.handle is not None else []
        kept = self._thin(e, ev.multiplicity)
        e.remaining -= ev.multiplicity
        actions = [] if e.keep_left else self._stop_generating(e)
        if kept == 0:
            return ([Release((ev.handle,))] if ev.handle is not None else []) + actions + self._progress(e, ev.time)
        c = self._new_candidate(e, ev, kept)
        if c.completed and c.handle is not None:  # an empty step ends the path; nothing continues it
            actions.append(Release((c.handle,)))
            c.handle = None
        if self.config.verification in ("immediate", "lazy"):
            actions.append(self._verify(c, completes_group=self._group_complete(e)))
        actions += self._start_lookahead(c, ev.time)
        return actions + self._progress(e, ev.time)

    def _on_lost(self, ev: GenerationLost) -> list:
        e = self.expansions[ev.expansion_id]
        e.remaining -= ev.multiplicity
        e.keep_left = min(e.keep_left, e.remaining)
        e.multiplicity -= ev.multiplicity
        if e.multiplicity == 0:
            e.cancelled = True
        return self._progress(e, ev.time)

    def _on_scores(self, ev: ScoresArrived) -> list:
        c = self.candidates.get(ev.candidate)
        if c is None or not c.alive:
            return []
        c.step_scores = ev.step_scores
        c.score = policies.aggregate(ev.step_scores, self.config.aggregation)
        c.state, c.verified_order = SCORED, next(self._verify_order)
        actions = []
        if ev.error is not None:  # e.g. the path no longer fits the PRM: finished with what it has
            c.completed, c.score_error = True, ev.error
            actions += self._release([c])
        if self.config.prune_strict and c.round == self.last_decided + 1:
            actions += self._prune_below_threshold(self.rounds[c.round])
        if c.alive and not c.completed:
            actions += self._speculate(c, ev.time)
        return actions + self._try_decide(ev.time)

    def _on_cancelled(self, ev: Cancelled) -> list:
        return self._finish(ev.time, error="cancelled")

    # ---- progress, verification and decisions -----------------------------------------------------
    def _progress(self, e: Expansion, time: float) -> list:
        """After a piece of expansion e finished or was lost: round-level verification and decisions."""
        actions = []
        rd = self.rounds[e.round]
        if self._round_generated(rd):
            actions += self._pause_lookaheads(rd)
            if self.config.verification in ("round", "per_request") and rd.index == self.last_decided + 1:
                actions += self._verify_round(rd)
        return actions + self._try_decide(time)

    def _round_generated(self, rd: Round) -> bool:
        return all(not e.live for e in rd.expansions if not e.lookahead)

    def _verify_round(self, rd: Round) -> list:
        """Round-at-once verification (plus FastTTS LookAhead: finished continuations of this round's
        candidates are scored in the same call)."""
        pending = [c for c in rd.candidates if c.alive and c.verified_order is None and not c.verify_sent]
        if self.config.lookahead and rd.index + 1 < len(self.rounds):
            ahead = self.rounds[rd.index + 1].candidates
            pending += [c for c in ahead if c.alive and c.verified_order is None and not c.verify_sent]
        return [self._verify(c, completes_group=True) for c in pending]

    def _verify(self, c: Candidate, completes_group: bool) -> Verify:
        c.verify_sent = True
        return Verify(c.id, tuple(c.steps()), completes_group)

    def _group_complete(self, e: Expansion) -> bool:
        siblings = e.parent.children if e.parent is not None else self.rounds[0].expansions
        return all(not s.live for s in siblings if not s.lookahead)

    def _try_decide(self, time: float) -> list:
        actions = []
        while not self.done and self.last_decided + 1 < len(self.rounds):
            rd = self.rounds[self.last_decided + 1]
            shortcut = self._perfect_scores(rd) if self.config.perfect_shortcut else None
            if shortcut is None and not self._round_ready(rd):
                break
            actions += self._decide(rd, shortcut, time)
        return actions

    def _round_ready(self, rd: Round) -> bool:
        if any(e.live for e in rd.expansions):
            return False
        return all(c.state == SCORED for c in rd.live_candidates())

    def _perfect_scores(self, rd: Round) -> list[tuple[Candidate, int]] | None:
        perfect = [c for c in rd.live_candidates() if c.state == SCORED and not c.completed and c.score >= 1.0]
        if sum(c.multiplicity for c in perfect) < self.k:
            return None
        chosen, left = [], self.k  # the first to be verified win
        for c in sorted(perfect, key=lambda c: c.verified_order):
            if left:
                chosen.append((c, min(c.multiplicity, left)))
                left -= chosen[-1][1]
        return chosen

    def _prune_below_threshold(self, rd: Round) -> list:
        scored = [c for c in rd.live_candidates() if c.state == SCORED and not c.completed]
        tau = policies.strict_threshold(scored, self.k)  # every one of them is certain: parents decided
        if tau is None:
            return []
        return self._drop([c for c in scored if c.score < tau])

    def _decide(self, rd: Round, shortcut, time: float) -> list:
        actions = self._close_early(rd, shortcut) if shortcut is not None else []
        live = rd.live_candidates()
        for c in live:
            if c.completed:
                c.state = COMPLETED
                self.finished_pool.append(c)
        active = [c for c in live if not c.completed]
        rd.decided, self.last_decided = True, rd.index
        self._record_waiting(rd, time)
        enough = sum(c.multiplicity for c in self.finished_pool) >= self.config.beam_size
        if enough or rd.index == self.last_round or not active:
            return actions + self._finish(time)
        retained = shortcut or self._select(active)
        finished = sum(c.multiplicity for c in rd.candidates if c.parent is None or c.parent.state == RETAINED)
        self.decisions.append(Decision(rd.index, tuple((tuple(c.steps()), n) for c, n in retained),
                                       finished, shortcut is not None, retained[0][0].score))
        kept = {c for c, _ in retained}
        actions += self._drop([c for c in active if c not in kept])
        counts = self._children_counts(retained)
        for c, copies in retained:
            c.state, c.retained_copies = RETAINED, copies
            actions += self._reconcile_children(c, counts[c], time)
        actions += self._release([c for c, _ in retained])
        actions += self._reprioritize()
        next_round = self.rounds[rd.index + 1]
        if self.config.prune_strict:
            actions += self._prune_below_threshold(next_round)
        actions += self._speculate_eligible(time)
        if self.config.verification in ("round", "per_request") and self._round_generated(next_round):
            actions += self._verify_round(next_round)
        return actions

    def _close_early(self, rd: Round, shortcut) -> list:
        kept = {c for c, _ in shortcut}
        losers = [c for c in rd.live_candidates() if c not in kept and not (c.completed and c.state == SCORED)]
        stopped = [a for e in rd.live_expansions() for a in self._stop_generating(e)]
        return stopped + self._drop(losers)

    def _select(self, active: list[Candidate]) -> list[tuple[Candidate, int]]:
        if self.config.selection != "dvts":
            return policies.top_k_copies(active, self.k)
        groups: dict[tuple, list[Candidate]] = {}
        for c in active:
            group = c.parent.key if c.parent is not None else (c.key[0] // self.config.beam_width,)
            groups.setdefault(group, []).append(c)
        return [policies.top_k_copies(members, 1)[0] for _, members in sorted(groups.items())]

    def _children_counts(self, retained) -> dict[Candidate, int]:
        if self.config.selection == "dvts":
            return {c: self.config.beam_width for c, _ in retained}
        if self.config.proportional_children:
            return policies.proportional_children(retained, self.config.beam_size)
        return policies.cyclic_children(retained, self.config.beam_size)

    def _record_waiting(self, rd: Round, time: float) -> None:
        idle = busy = 0.0
        for c in rd.candidates:
            if c.state == COMPLETED or c.state == RETAINED or c.state == SCORED:
                start = max(c.expansion.created_at, self._round_start(rd))
                busy += max(c.finished_at - start, 0.0)
                idle += max(time - c.finished_at, 0.0)
        self.round_waiting.append((idle, busy))

    def _round_start(self, rd: Round) -> float:
        return min((e.created_at for e in rd.expansions), default=0.0)

    # ---- expansions -------------------------------------------------------------------------------
    def _expand(self, parent: Candidate | None, round_index: int, count: int, time: float) -> list:
        """count more logical children of parent: one expansion (CD) or count expansions of one."""
        if count <= 0:
            return []
        sizes = [count] if self.config.dedup else [1] * count
        return [Expand(*self._expand_fields(self._new_expansion(parent, round_index, size, time)))
                for size in sizes]

    def _expand_fields(self, e: Expansion) -> tuple:
        parent_handle = e.parent.handle if e.parent is not None else None
        final = e.round == self.last_round
        return (e.id, parent_handle, e.multiplicity, e.priority, final, e.seed, e.lookahead)

    def _new_expansion(self, parent, round_index: int, size: int, time: float, lookahead=False) -> Expansion:
        while len(self.rounds) <= round_index:
            self.rounds.append(Round(len(self.rounds)))
        siblings = parent.children if parent is not None else self.rounds[0].expansions
        index = sum(s.multiplicity for s in siblings)
        parent_key = parent.key if parent is not None else ()
        e = Expansion(next(self._ids), parent, round_index, parent_key + (index,), size,
                      policies.child_seed(self.config.seed, parent_key, index), time, lookahead=lookahead)
        e.priority = LOOKAHEAD_PRIORITY if lookahead else self._priority(e)
        self.expansions[e.id] = e
        self.rounds[round_index].expansions.append(e)
        if parent is not None:
            parent.children.append(e)
        return e

    def _priority(self, e: Expansion) -> int:
        """0 for real work; -d for speculation d rounds ahead of the round being decided."""
        if e.lookahead:
            return LOOKAHEAD_PRIORITY
        return -max(e.round - (self.last_decided + 1), 0)

    def _speculate(self, c: Candidate, time: float) -> list:
        if not self.config.speculative or c.children or c.round >= self.last_round:
            return []
        if c.round + 1 - (self.last_decided + 1) > self.config.speculation_depth:
            return []
        return self._expand(c, c.round + 1, c.multiplicity * self.config.beam_width, time)

    def _speculate_eligible(self, time: float) -> list:
        actions = []
        for rd in self.rounds[self.last_decided + 1:]:
            for c in rd.live_candidates():
                if c.state == SCORED and not c.completed:
                    actions += self._speculate(c, time)
        return actions

    def _reconcile_children(self, c: Candidate, wanted: int, time: float) -> list:
        """Make c's children add up to `wanted` logical copies: create the missing ones, thin the excess
        (speculation may have started more), resume a paused FastTTS continuation."""
        children = [e for e in c.children if not e.cancelled]
        have = sum(e.multiplicity for e in children)
        actions = []
        for e in sorted(children, key=lambda e: e.key, reverse=True):  # youngest first
            if have <= wanted:
                break
            drop = min(have - wanted, e.multiplicity)
            actions += self._shrink(e, e.multiplicity - drop)
            have -= drop
        for e in children:
            if e.lookahead and not e.cancelled:
                e.lookahead = False
                e.priority = 0
                if e.paused and e.live:
                    e.paused = False
                    actions.append(Resume((e.id,), 0))
        return actions + self._expand(c, c.round + 1, wanted - have, time)

    def _shrink(self, e: Expansion, target: int) -> list:
        """Keep a uniformly random `target` of e's logical copies (finished pieces included)."""
        if target == 0:
            return self._cancel_expansions([e])
        total, keep = e.multiplicity - e.remaining + e.keep_left, target
        actions = []
        for c in e.finished:
            if not c.alive:
                total -= c.multiplicity
                continue
            kept = policies.kept_copies(self.rng, total, keep, c.multiplicity)
            total, keep = total - c.multiplicity, keep - kept
            if kept == 0:
                actions += self._drop([c])
            c.multiplicity = kept or c.multiplicity
        e.keep_left = min(keep, e.remaining)
        e.multiplicity = target
        return actions + ([] if e.keep_left else self._stop_generating(e))

    def _thin(self, e: Expansion, piece: int) -> int:
        if e.keep_left >= e.remaining:
            e.keep_left -= piece
            return piece
        kept = policies.kept_copies(self.rng, e.remaining, e.keep_left, piece)
        e.keep_left -= kept
        return kept

    def _reprioritize(self) -> list:
        changed: dict[int, list[int]] = {}
        for e in self.expansions.values():
            if e.live and not e.lookahead:
                p = self._priority(e)
                if p != e.priority:
                    e.priority = p
                    changed.setdefault(p, []).append(e.id)
        return [SetPriority(tuple(ids), p) for p, ids in changed.items()]

    # ---- FastTTS lookahead -------------------------------------------------------------------------
    def _start_lookahead(self, c: Candidate, time: float) -> list:
        certain = c.parent is None or c.parent.state == RETAINED
        if not self.config.lookahead or c.completed or not certain or c.round >= self.last_round:
            return []
        e = self._new_expansion(c, c.round + 1, 1, time, lookahead=True)
        return [Expand(*self._expand_fields(e))]

    def _pause_lookaheads(self, rd: Round) -> list:
        """The round's last real step finished: its candidates' continuations stop for now."""
        if not self.config.lookahead or rd.index + 1 >= len(self.rounds):
            return []
        running = [e for e in self.rounds[rd.index + 1].expansions if e.lookahead and e.live and not e.paused]
        for e in running:
            e.paused = True
        return [Pause(tuple(e.id for e in running))] if running else []

    # ---- cancellation -------------------------------------------------------------------------------
    def _drop(self, candidates: list[Candidate]) -> list:
        subtree = Subtree()
        for c in candidates:
            subtree.drop_candidate(c)
        return _cancel(subtree)

    def _stop_generating(self, e: Expansion) -> list:
        """Abort e's pieces still generating; its finished pieces stay."""
        if not e.remaining or e.cancelled:
            return []
        e.remaining = e.keep_left = 0
        return [Cancel((e.id,), ())]

    def _cancel_expansions(self, group: list[Expansion]) -> list:
        subtree = Subtree()
        for e in group:
            subtree.drop_expansion(e)
        return _cancel(subtree)

    def _release(self, candidates: list[Candidate]) -> list:
        handles = [c.handle for c in candidates if c.handle is not None]
        for c in candidates:
            c.handle = None
        return [Release(tuple(handles))] if handles else []

    def _new_candidate(self, e: Expansion, ev: StepFinished, kept: int) -> Candidate:
        completed = ev.completed or not ev.text.strip() or e.round == self.last_round
        c = Candidate(next(self._ids), ev.handle, e, e.key + (len(e.finished),), ev.text, ev.num_tokens, kept,
                      completed, ev.time, next(self._finish_order))
        e.finished.append(c)
        self.candidates[c.id] = c
        self.rounds[e.round].candidates.append(c)
        return c

    # ---- the end ---------------------------------------------------------------------------------
    def _finish(self, time: float, error: str | None = None) -> list:
        self.done = True
        actions = [a for e in self.expansions.values() for a in self._stop_generating(e)]
        actions += self._release([c for c in self.candidates.values() if c.handle is not None])
        self.result = build_result(self.finished_pool, self.config.beam_size, self.last_decided + 1, error)
        return actions + [Done()]



def _cancel(subtree: Subtree) -> list:
    if subtree.empty:
        return []
    return [Cancel(tuple(subtree.expansions), tuple(subtree.handles), tuple(subtree.candidates))]
