"""One request's search as a state machine: `on(event) -> actions`, sans I/O (docs/design.md).

Round r's candidates each finish one step; the PRM scores them; the round is decided by the selection
policy (`search/selection.py`: beam, best-of-N, DVTS), which says which paths complete, which logical
copies are retained and how many children each gets. A variant is a composition of policy objects built
from its `SearchConfig` (a preset line in `search/presets.py`):

- verification (`search/verification.py`): a step goes to the PRM as it finishes, or a round at once;
- speculation (`search/speculation.py`): none, or eager expansion of verified candidates (naive-spec, EP);
  its hooks run when a score arrives and when a round is decided, and it gives each expansion its priority;
- lookahead (`search/lookahead.py`): FastTTS's LookAhead continuations with head starts and a per-request
  valve, one policy whose hooks run when a step finishes, a round has generated or is verified at once;
- pruning (`search/pruning.py`): which verified candidates to cancel after a score arrives and after a round
  is decided (none, the strict early-pruning threshold, ...), and the perfect-score shortcut;
- dedup (`search/dedup.py`): computation deduplication (one expansion per parent, one lane per logical
  child) and search-and-learn's duplicate filtering;
- partial rejection (`search/partial_rejection.py`): a PRM readout of a running step's first tokens
  (`StepPartial`) and the stop of a step clearly below its round's bar.

Every kind of policy is a registry of classes (`search/registry.py`), and `build_policies`
(`search/policy_set.py`) builds a search's policies from its config. `Search` calls each policy's hooks, handing
itself over as a `SearchOps` (`search/ops.py`: the typed operations a policy may ask for — expand children,
verify a candidate or a round, re-rank expansions — and what it may read), and never tests what kind of policy
it holds, nor what a LookAhead continuation is: it asks the lookahead policy whether an expansion is its round's
real work, what priority a continuation runs at, and what new children start from. A new variant is one policy
class and one preset line.

Every logical child has a canonical tree position (its key) and samples from that position's seed
(`search/seeds.py`), whether it is its own engine row or a lane of a CD row.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from specscale.config import SearchConfig
from specscale.search import policies
from specscale.search.early_exit import Exit, exited
from specscale.search.policy_set import build_policies
from specscale.search.protocol import (
    Action,
    Cancel,
    Cancelled,
    Done,
    Expand,
    GenerationLost,
    Release,
    ScoresArrived,
    SetPriority,
    StepFinished,
    StepPartial,
    Verify,
)
from specscale.search.result import SearchResult, build_result
from specscale.search.seeds import seeds_of
from specscale.search.tree import Candidate, CandidateState, Expansion, Key, Round, Subtree


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
    """One request's search; implements `SearchOps` (`search/ops.py`), the operations its policies call."""

    def __init__(self, config: SearchConfig):
        self.config = config
        self.k = config.num_retained
        built = build_policies(config)  # a ValueError if the config names an unknown policy
        self.selection = built.selection
        self.verification = built.verification
        self.speculation = built.speculation
        self.lookahead = built.lookahead
        self.pruning = built.pruning
        self.shortcut = built.shortcut
        self.dedup = built.dedup
        self.exit = built.exit
        self.partial = built.partial
        self.last_round = self.selection.last_round()  # the round that generates to EOS
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
        return self.expand(None, 0, [(i,) for i in range(self.config.beam_size)], time)

    def on(self, event) -> list:
        if self.done:
            handle = getattr(event, "handle", None)
            return [Release((handle,))] if handle is not None else []
        handlers: dict[type, Callable[[Any], list]] = {
            StepFinished: self._on_step_finished, ScoresArrived: self._on_scores,
            GenerationLost: self._on_lost, Cancelled: self._on_cancelled, StepPartial: self._on_partial,
        }
        handler = handlers.get(type(event))
        return handler(event) if handler else []

    # ---- events ---------------------------------------------------------------------------------
    def _on_step_finished(self, ev: StepFinished) -> list:
        e = self.expansions[ev.expansion_id]
        if e.cancelled:
            return [Release((ev.handle,))] if ev.handle is not None else []
        kept = tuple(j for j in ev.lanes if j in e.kept)
        e.pending -= set(ev.lanes)
        actions = [] if e.keep_left else self._stop_generating(e)
        actions += self.partial.on_step_finished(self, e)
        if not kept:
            return ([Release((ev.handle,))] if ev.handle is not None else []) + actions + self._progress(e, ev.time)
        c = self._new_candidate(e, ev, kept)
        if c.completed and c.handle is not None:  # an empty step ends the path; nothing continues it
            actions.append(Release((c.handle,)))
            c.handle = None
        actions += self.verification.on_step_finished(self, c)
        actions += self.lookahead.on_step_finished(self, c, ev.time)
        return actions + self._progress(e, ev.time)

    def _on_lost(self, ev: GenerationLost) -> list:
        e = self.expansions[ev.expansion_id]
        e.pending -= set(ev.lanes)
        e.kept -= set(ev.lanes)
        if not e.kept:
            e.cancelled = True
        return self._progress(e, ev.time)

    def _on_partial(self, ev: StepPartial) -> list:
        return self.partial.on_partial(self, ev)

    def _on_scores(self, ev: ScoresArrived) -> list:
        c = self.candidates.get(ev.candidate)
        if c is None:  # a partial readout (search/partial_rejection.py)
            return self.partial.on_scored(self, ev)
        if not c.alive:
            return []
        c.step_scores = ev.step_scores
        c.score = policies.aggregate(ev.step_scores, self.config.aggregation)
        c.state, c.verified_order = SCORED, next(self._verify_order)
        actions = []
        if ev.error is not None:  # e.g. the path no longer fits the PRM: finished with what it has
            c.completed, c.score_error = True, ev.error
            actions += self._release([c])
        actions += self._drop(self.pruning.after_score(self, c))
        actions += self.speculation.on_scored(self, c, ev.time)
        actions += self._try_decide(ev.time)
        actions += [] if self.done else self.partial.after_score(self, c, ev.time)
        return actions + ([] if self.done else self._exit(self.exit.after_score(self, self.finished_pool), ev.time))

    def _on_cancelled(self, ev: Cancelled) -> list:
        return self._finish(ev.time, error="cancelled")

    # ---- progress, verification and decisions -----------------------------------------------------
    def _progress(self, e: Expansion, time: float) -> list:
        """After a piece of expansion e finished or was lost: round-level verification and decisions."""
        actions = []
        rd = self.rounds[e.round]
        if self._round_generated(rd):
            actions += self.lookahead.on_round_generated(self, rd)
            actions += self.verification.on_round_generated(self, rd)
        return actions + self._try_decide(time)

    def _round_generated(self, rd: Round) -> bool:
        """Whether the round's real work has finished generating (the lookahead policy's continuations aside)."""
        return all(not e.live for e in rd.expansions if self.lookahead.round_work(e))

    def verify_round(self, rd: Round) -> list[Action]:
        """Round-at-once verification (plus what the lookahead policy scores with the round: FastTTS's
        finished continuations of this round's candidates)."""
        pending = [c for c in rd.candidates if c.alive and c.verified_order is None and not c.verify_sent]
        pending += self.lookahead.verified_with_round(self, rd)
        return [self.verify(c, completes_group=True) for c in pending]  # a finished round: complete groups

    def verify(self, c: Candidate, completes_group: bool) -> Verify:
        c.verify_sent = True
        return Verify(c.id, tuple(c.steps()), completes_group)

    def new_id(self) -> int:
        """A fresh id: expansions, candidates and partial readouts share one space."""
        return next(self._ids)

    def stop_lanes(self, e: Expansion, lanes: tuple[int, ...], handle: int, time: float) -> list[Action]:
        """Stop lanes of e that sequence `handle` is still generating (partial rejection): their children are
        no longer wanted; the sequence is aborted (e's other sequences too when no wanted lane is left)."""
        stopped = set(lanes)
        others = (e.pending & e.kept) - stopped
        e.kept -= stopped
        if others:
            e.pending -= stopped
            actions: list[Action] = [Cancel(handles=(handle,))]
        else:
            actions = self._stop_generating(e)
        if not e.kept:
            e.cancelled = True
        return actions + self._progress(e, time)

    def group_complete(self, e: Expansion) -> bool:
        """Whether e's group has finished its step (lazy verification's group trigger): its sibling group,
        or with `lv_group` "round" its whole round (the round before it decided, so every expansion of this
        round is known, and none of them live)."""
        if self.config.lv_group == "round":
            return self.last_decided >= e.round - 1 and self._round_generated(self.rounds[e.round])
        siblings = e.parent.children if e.parent is not None else self.rounds[0].expansions
        return all(not s.live for s in siblings if self.lookahead.round_work(s))

    def _try_decide(self, time: float) -> list:
        actions = []
        while not self.done and self.last_decided + 1 < len(self.rounds):
            rd = self.rounds[self.last_decided + 1]
            shortcut = self.shortcut.closes(rd)
            if shortcut is None and not self._round_ready(rd):
                break
            actions += self._decide(rd, shortcut, time)
        return actions

    def _round_ready(self, rd: Round) -> bool:
        if any(e.live for e in rd.expansions) or self.lookahead.awaiting_scores(self, rd):
            return False
        return all(c.state == SCORED for c in rd.live_candidates())

    def _decide(self, rd: Round, shortcut, time: float) -> list:
        actions = self._close_early(rd, shortcut) if shortcut is not None else []
        verdict = self.selection.decide(rd.live_candidates(), self.finished_pool, rd.index == self.last_round)
        for c in verdict.completed:
            c.state, c.completed = COMPLETED, True
            self.finished_pool.append(c)
        actions += self._release(verdict.completed)
        rd.decided, self.last_decided = True, rd.index
        self._record_waiting(rd, time)
        if verdict.done:
            return actions + self._finish(time)
        retained = shortcut or verdict.retained
        exit_now = self.exit.after_decision(self, self.finished_pool, retained)
        if exit_now is not None:
            return actions + self._exit(exit_now, time)
        kept = {c for c, _ in retained}
        actions += self._drop([c for c in verdict.dropped + [c for c, _ in verdict.retained] if c not in kept])
        finished = sum(c.multiplicity for c in rd.candidates if c.parent is None or c.parent.state == RETAINED)
        self.decisions.append(Decision(rd.index, tuple((tuple(c.steps()), n) for c, n in retained),
                                       finished, shortcut is not None, retained[0][0].score))
        children = self._children_keys(retained)
        for c, copies in retained:
            c.state, c.retained_copies = RETAINED, copies
            actions += self._reconcile_children(c, children[c], time)
        actions += self._release([c for c, _ in retained])
        actions += self.reprioritize()
        next_round = self.rounds[rd.index + 1]
        actions += self._drop(self.pruning.after_decision(self, next_round))
        actions += self.speculation.on_round_decided(self, time)
        if self._round_generated(next_round):
            actions += self.verification.on_round_generated(self, next_round)
        return actions

    def _close_early(self, rd: Round, shortcut) -> list:
        kept = {c for c, _ in shortcut}
        losers = [c for c in rd.live_candidates() if c not in kept and not (c.completed and c.state == SCORED)]
        stopped = [a for e in rd.live_expansions() for a in self._stop_generating(e)]
        return stopped + self._drop(losers)

    def _children_keys(self, retained) -> dict[Candidate, list]:
        """The tree positions of each retained candidate's children: copy ℓ of c (its lane key) gets
        count_ℓ children at lane_key + (0,) .. lane_key + (count_ℓ - 1,)."""
        per_copy = iter(self.selection.children(retained))
        return {c: [key + (i,) for key in c.lane_keys[:copies] for i in range(next(per_copy))]
                for c, copies in retained}

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
    def expand(self, parent: Candidate | None, round_index: int, child_keys: list[Key], time: float) -> list[Action]:
        """These logical children of parent: one expansion (CD) or one expansion per child."""
        return [self.expand_action(e) for e in self._new_children(parent, round_index, child_keys, time)]

    def _new_children(self, parent: Candidate | None, round_index: int, child_keys: list[Key],
                      time: float) -> list[Expansion]:
        """The expansions of these logical children, grouped by the dedup policy, added to the tree."""
        if not child_keys:
            return []
        return [self.new_expansion(parent, round_index, keys, time) for keys in self.dedup.expansions(child_keys)]

    def expand_action(self, e: Expansion) -> Expand:
        parent_handle = e.parent.handle if e.parent is not None else None
        final = e.round == self.last_round
        return Expand(e.id, parent_handle, e.multiplicity, e.priority, final, e.seeds, e.lookahead, e.start_from)

    def new_expansion(self, parent: Candidate | None, round_index: int, child_keys: tuple[Key, ...], time: float,
                      lookahead: bool = False) -> Expansion:
        while len(self.rounds) <= round_index:
            self.rounds.append(Round(len(self.rounds)))
        seeds = seeds_of(self.config.seed, child_keys)
        e = Expansion(next(self._ids), parent, round_index, child_keys, seeds, time, lookahead=lookahead)
        e.priority = self._priority(e)
        self.expansions[e.id] = e
        self.rounds[round_index].expansions.append(e)
        if parent is not None:
            parent.children.append(e)
        return e

    def _priority(self, e: Expansion) -> int:
        """The speculation policy ranks the rounds' real work; the lookahead policy what runs ahead of it."""
        if self.lookahead.round_work(e):
            return self.speculation.priority(self, e)
        return self.lookahead.priority(e)

    def _reconcile_children(self, c: Candidate, wanted: list[Key], time: float) -> list[Action]:
        """Make c's children exactly the logical children at tree positions `wanted`: keep those already
        started (speculation, LookAhead), drop the others' lanes, start the missing ones (from what the
        lookahead policy says they start from)."""
        wanted_keys = set(wanted)
        have: set[Key] = set()
        actions: list[Action] = []
        for e in [e for e in c.children if not e.cancelled]:
            keep = {j for j in e.kept if e.child_keys[j] in wanted_keys}
            if keep != e.kept:
                actions += self._shrink(e, keep)
            have |= {e.child_keys[j] for j in keep}
            actions += self.lookahead.on_child_kept(e)
        new = self._new_children(c, c.round + 1, [key for key in wanted if key not in have], time)
        self.lookahead.on_children_started(c, new)
        return actions + [self.expand_action(e) for e in new]

    def _shrink(self, e: Expansion, keep: set[int]) -> list:
        """Keep only lanes `keep` of e: finished pieces lose their other lanes, generating ones are
        ignored when they finish (or stopped when no kept lane is left)."""
        if not keep:
            return self._cancel_expansions([e])
        e.kept = set(keep)
        actions = []
        for c in e.finished:
            if c.alive:
                lanes = tuple(j for j in c.lanes if j in keep)
                if lanes:
                    c.lanes = lanes
                else:
                    actions += self._drop([c])
        return actions + ([] if e.keep_left else self._stop_generating(e))

    def reprioritize(self, expansions: Iterable[Expansion] | None = None) -> list[Action]:
        """SetPriority for the live expansions (default: all) of the rounds' real work whose priority changed."""
        changed: dict[int, list[int]] = {}
        for e in self.expansions.values() if expansions is None else expansions:
            if e.live and self.lookahead.round_work(e):
                p = self._priority(e)
                if p != e.priority:
                    e.priority = p
                    changed.setdefault(p, []).append(e.id)
        return [SetPriority(tuple(ids), p) for p, ids in changed.items()]

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
        e.pending = set()
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

    def _new_candidate(self, e: Expansion, ev: StepFinished, lanes: tuple[int, ...]) -> Candidate:
        completed = ev.completed or not ev.text.strip() or e.round == self.last_round
        c = Candidate(next(self._ids), ev.handle, e, lanes, ev.text, ev.num_tokens, completed, ev.time,
                      next(self._finish_order), finish_reason=ev.finish_reason)
        e.finished.append(c)
        self.candidates[c.id] = c
        self.rounds[e.round].candidates.append(c)
        return c

    # ---- the end ---------------------------------------------------------------------------------
    def _exit(self, how: Exit | None, time: float) -> list:
        """The exit policy ends the search (how.pooled join the finished pool first); nothing if it does not."""
        if how is None:
            return []
        for c in how.pooled:
            c.state, c.completed = COMPLETED, True
            self.finished_pool.append(c)
        actions = self._finish(time)
        self.result = exited(self.result, how.reason) if self.result is not None else None
        return actions

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
