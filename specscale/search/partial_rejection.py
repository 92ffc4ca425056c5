"""Partial-step rejection: stop a step while it is still being written when a PRM readout of its first tokens
puts it clearly below what its round keeps (docs/design.md, "Partial-step rejection"; issue 46, point 1; after
ER-PRM, Cheshmi et al. 2025, whose PRMs score partial steps).

`SearchConfig.partial_rejection` names one; each class registers under its name in `PARTIAL`
(`search/registry.py`). `Search` hands the policy a `StepPartial` event (a sequence has written
`watch_tokens` tokens of its step: the runtime sees it in the generator's updates, on every backend), the
scores of what the policy sent to the PRM, every candidate's score, and every finished step of an expansion.

- off: nothing is watched; the search is exactly the search without this policy;
- kth: at `partial_tokens` tokens a running step's path (its parent's steps and the partial step) goes to the
  PRM under a fresh id, as a readout that rides along with every PRM batch that runs anyway (small inputs
  batched with everything else; `runtime/verify_queue.py`) and triggers none. Once scored, the partial path's score (its step
  scores aggregated as the search aggregates, the partial step's last) is compared, in the round being decided
  only (every parent there is retained), with the bar: the round's k-th best verified score (counting copies)
  less `partial_margin`, or, once more than k copies of the round have partial scores of running steps, the
  k-th best of those less `partial_margin`, whichever is higher. A running step strictly below the bar is
  stopped (`SearchOps.stop_lanes`: its sequence aborted and its KV freed at once). Not exact: a stopped step
  might have finished above the round's k-th best. A partial score of a round still speculative waits for the
  next score of its round after that round's parents are decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from specscale.config import SearchConfig
from specscale.search import policies
from specscale.search.ops import SearchOps
from specscale.search.protocol import Action, Cancel, ScoresArrived, StepPartial, Verify
from specscale.search.registry import Registry
from specscale.search.tree import Candidate, Expansion, Round

PARTIAL: Registry[NoPartialRejection] = Registry("partial_rejection")


@dataclass(eq=False)
class Partial:
    """A running step's partial readout: sequence `handle` holds lanes `lanes` of `expansion`; score: its path's
    aggregated score with the partial step, None until the PRM has read it."""

    id: int
    expansion: Expansion
    lanes: tuple[int, ...]
    handle: int
    score: float | None = None

    @property
    def copies(self) -> int:
        return len(self.lanes)

    def running(self) -> bool:
        """Every lane it holds is still generating and wanted."""
        e = self.expansion
        return not e.cancelled and set(self.lanes) <= (e.pending & e.kept)


@PARTIAL.register("off")
class NoPartialRejection:
    """No step is watched; every hook does nothing."""

    watch_tokens: int | None = None  # the runtime reports a step that reaches this many tokens (None: none)

    def __init__(self, config: SearchConfig):
        self.config = config
        self.rejected_copies = 0  # logical children stopped (tests, tracing)

    def on_partial(self, search: SearchOps, ev: StepPartial) -> list[Action]:
        """A running step reached `watch_tokens`: what to send to the PRM."""
        return []

    def on_scored(self, search: SearchOps, ev: ScoresArrived) -> list[Action]:
        """Scores arrived for an id that is no candidate (a partial readout)."""
        return []

    def after_score(self, search: SearchOps, c: Candidate, time: float) -> list[Action]:
        """Candidate c was scored (its round's bar may have risen)."""
        return []

    def on_step_finished(self, search: SearchOps, e: Expansion) -> list[Action]:
        """A piece of expansion e finished its step: its partial readouts not yet sent to the PRM are moot."""
        return []


@PARTIAL.register("kth")
class KthPartialRejection(NoPartialRejection):
    def __init__(self, config: SearchConfig):
        super().__init__(config)
        self.watch_tokens = config.partial_tokens
        self.partials: dict[int, Partial] = {}

    def on_partial(self, search: SearchOps, ev: StepPartial) -> list[Action]:
        e = search.expansions[ev.expansion_id]
        if e.cancelled or not set(ev.lanes) <= (e.pending & e.kept):
            return []
        partial = Partial(search.new_id(), e, ev.lanes, ev.handle)
        self.partials[partial.id] = partial
        steps = tuple(e.parent.steps()) if e.parent is not None else ()
        return [Verify(partial.id, steps + (ev.text,), completes_group=False, partial=True)]

    def on_scored(self, search: SearchOps, ev: ScoresArrived) -> list[Action]:
        partial = self.partials.get(ev.candidate)
        if partial is None:
            return []
        if ev.error is not None or not ev.step_scores or not partial.running():
            del self.partials[partial.id]
            return []
        partial.score = policies.aggregate(ev.step_scores, self.config.aggregation)
        return self._judge(search, search.rounds[partial.expansion.round], ev.time)

    def after_score(self, search: SearchOps, c: Candidate, time: float) -> list[Action]:
        return self._judge(search, search.rounds[c.round], time)

    def on_step_finished(self, search: SearchOps, e: Expansion) -> list[Action]:
        return self._forget_moot(search.rounds[e.round])

    def _judge(self, search: SearchOps, rd: Round, time: float) -> list[Action]:
        """Stop the running steps of the round being decided whose partial score is below its bar."""
        if rd.decided or rd.index != search.last_decided + 1:
            return []
        actions = self._forget_moot(rd)
        live = [p for p in self.partials.values() if p.expansion.round == rd.index and p.score is not None]
        bar = self._bar(rd, live)
        if bar is None:
            return actions
        for partial in live:
            if partial.score is not None and partial.score < bar and partial.running():
                actions += self._reject(search, partial, time)
        return actions

    def _forget_moot(self, rd: Round) -> list[Action]:
        """Forget the round's partial readouts whose steps no longer run (finished, pruned, cancelled, lost); those
        still queued for the PRM are dropped from its queue."""
        moot = [p for p in self.partials.values() if p.expansion.round == rd.index and not p.running()]
        for p in moot:
            del self.partials[p.id]
        unscored = tuple(p.id for p in moot if p.score is None)
        return [Cancel(candidates=unscored)] if unscored else []

    def _bar(self, rd: Round, live: list[Partial]) -> float | None:
        """The score a running step's partial must reach; None while neither rule has enough scores."""
        k, margin = self.config.num_retained, self.config.partial_margin
        verified = [(c.score, c.multiplicity) for c in rd.live_candidates() if c.score is not None]
        partial_scores = [(p.score, p.copies) for p in live if p.score is not None]
        enough_partials = sum(copies for _, copies in partial_scores) > k
        kth_partial = kth_best(partial_scores, k) if enough_partials else None
        bars = [score - margin for score in (kth_best(verified, k), kth_partial) if score is not None]
        return max(bars) if bars else None

    def _reject(self, search: SearchOps, partial: Partial, time: float) -> list[Action]:
        del self.partials[partial.id]
        self.rejected_copies += partial.copies
        return search.stop_lanes(partial.expansion, partial.lanes, partial.handle, time)


def kth_best(scores: list[tuple[float, int]], k: int) -> float | None:
    """The k-th best of these (score, copies), counting copies; None with fewer than k copies."""
    seen = 0
    for score, copies in sorted(scores, key=lambda sc: -sc[0]):
        seen += copies
        if seen >= k:
            return score
    return None
