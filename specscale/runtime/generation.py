"""Generation: one generator iteration of the search runtime's tick and what each sequence's update means for
its search (docs/architecture.md, steps 5 and 6).

An iteration's time goes to the run's metrics and to every request it advanced; a CD split registers its new
sequence; a prompt's readout starts round 0; a sequence stopped at a step's end (or finished, or cut by
length) becomes a `StepFinished` event, and one the generator lost becomes `GenerationLost`. A step still being
written that just reached the tokens its search's partial-rejection policy watches for
(`search/partial_rejection.py`, `watch_tokens`) becomes a `StepPartial` event: the runtime reads it from the
updates' new tokens, so it needs nothing of the backend.
"""

from __future__ import annotations

from collections.abc import Callable

from specscale.runtime.backend import GeneratorBackend
from specscale.runtime.expansions import Expansions
from specscale.runtime.metrics import RunMetrics
from specscale.runtime.request_state import Physical
from specscale.runtime.sequences import Sequences
from specscale.seam import SequenceState, SequenceUpdate
from specscale.search.protocol import GenerationLost, StepFinished, StepPartial


class Generation:
    def __init__(self, generator: GeneratorBackend, sequences: Sequences, expansions: Expansions,
                 clock: Callable[[], float]):
        self.generator = generator
        self.sequences = sequences
        self.expansions = expansions
        self.clock = clock

    def iterate(self, metrics: RunMetrics) -> list[SequenceUpdate]:
        """Run one generator iteration; its time is counted and its CD splits registered."""
        start = self.clock()
        updates = self.generator.step()
        elapsed = self.clock() - start
        metrics.generation_s += elapsed
        self.sequences.register_splits(updates)
        physical = self.sequences.physical
        touched = {physical[u.seq_id].request for u in updates if u.seq_id in physical}
        for state in touched:
            state.generation_s += elapsed
        return updates

    def event_of(self, phys: Physical, update: SequenceUpdate,
                 metrics: RunMetrics) -> StepFinished | StepPartial | GenerationLost | None:
        """The sequence's update recorded; the event it is for its search, None while it generates (but for the
        update that brings it to the tokens a partial readout is asked at) or for the prompt's readout, which
        starts round 0's expansions."""
        state = phys.request
        if update.state == SequenceState.READOUT:
            self.expansions.on_prefix_ready(state)
            return None
        written = len(phys.tokens)
        phys.tokens += update.new_token_ids
        phys.multiplicity = update.multiplicity
        state.generated_tokens += len(update.new_token_ids)
        if update.state == SequenceState.GENERATING:
            return self._partial(phys, update, written)
        now = self.clock()
        expansion = phys.expansion_id
        state.expansion_seqs.get(expansion, set()).discard(update.seq_id)
        if update.state == SequenceState.LOST:  # the backend freed it already
            self.sequences.account_cancelled(self.sequences.physical.pop(update.seq_id), metrics)
            return GenerationLost(expansion, update.lane_ids, now)
        return self._step_finished(phys, update, now)

    def _partial(self, phys: Physical, update: SequenceUpdate, written: int) -> StepPartial | None:
        """A StepPartial when this update brought the step from `written` tokens to the ones watched for."""
        watch = phys.request.search.partial.watch_tokens
        if watch is None or phys.expansion_id is None or not written < watch <= len(phys.tokens):
            return None
        return StepPartial(phys.expansion_id, update.seq_id, self.generator.decode(phys.tokens), len(phys.tokens),
                           update.lane_ids, self.clock())

    def _step_finished(self, phys: Physical, update: SequenceUpdate, now: float) -> StepFinished:
        """A step ended: a finished path leaves the runtime's records, a paused one is held as a candidate."""
        state = phys.request
        expansion = phys.expansion_id
        completed = update.state == SequenceState.FINISHED
        if completed:
            self.sequences.physical.pop(update.seq_id, None)
        else:
            phys.expansion_id = None
            state.held.add(update.seq_id)
        text = self.generator.decode(phys.tokens)
        return StepFinished(expansion, None if completed else update.seq_id, text, len(phys.tokens),
                            update.lane_ids, completed, now, update.end_reason.value)
