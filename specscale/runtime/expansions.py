"""Expansions: a search's expansions carried out on engine sequences (docs/architecture.md, step 4).

The prompt is prefilled once as a prefill-only sequence and round 0's expansions wait for it; each `Expand`
becomes a `StartSequence` (a one-token prompt) or a `BranchSequence` sharing its parent's paused KV, with
sampling params, the step separator as stop string, a priority, a multiplicity, lane seeds and the ids its
CD splits will take. `SetPriority`, `Pause` and `Resume` reach every sequence of an expansion; `Cancel` and
`Release` abort sequences. The operations are queued on `runtime/sequences.py`'s `Sequences`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from specscale.prompts import STEP_SEPARATOR
from specscale.runtime.metrics import RunMetrics
from specscale.runtime.request_state import Physical, RequestState
from specscale.runtime.sequences import Sequences
from specscale.seam import (
    BranchSequence,
    PauseSequence,
    PrioritizeSequence,
    SamplingParams,
    SequenceId,
    StartSequence,
)
from specscale.search.protocol import Cancel, Expand


class Expansions:
    def __init__(self, sequences: Sequences, clock: Callable[[], float]):
        self.sequences = sequences
        self.clock = clock

    def start_prefix(self, state: RequestState) -> None:
        """Prefill the prompt once (all but its last token); round 0 forks it."""
        prompt = state.request.prompt_ids
        if len(prompt) < 2:
            return
        seq, _ = self.sequences.new_ids(1)
        self.sequences.queue(StartSequence(seq, tuple(prompt[:-1]), None, readout_positions=(len(prompt) - 2,)))
        state.prefix_seq = seq
        self.sequences.track(seq, Physical(state, None, False, self.clock()))

    def on_prefix_ready(self, state: RequestState) -> None:
        """The prompt is prefilled: round 0's deferred expansions start from it, and it goes."""
        deferred, state.deferred = state.deferred, []
        for action in deferred:
            self._start(state, action)
        self.sequences.release(state.prefix_seq)
        state.prefix_seq = None

    def expand(self, state: RequestState, action: Expand) -> None:
        if action.parent_handle is None and state.prefix_seq is not None:
            state.deferred.append(action)  # round 0 waits until the prompt is prefilled
            return
        self._start(state, action)

    def _start(self, state: RequestState, action: Expand) -> None:
        config = state.config
        params = SamplingParams(
            temperature=config.temperature, top_p=config.top_p, seed=action.seeds[0] if action.seeds else None,
            max_new_tokens=config.max_step_tokens, stop=() if action.final_round else (STEP_SEPARATOR,),
        )
        seq, split_ids = self.sequences.new_ids(action.multiplicity)
        source = action.parent_handle if action.parent_handle is not None else state.prefix_seq
        head = self._head_start(state, action)
        if source is None:  # a one-token prompt: nothing to share
            self.sequences.queue(StartSequence(seq, tuple(state.request.prompt_ids), params, action.priority,
                                               action.multiplicity, (), action.lookahead, split_ids, action.seeds))
        else:
            extra = (state.request.prompt_ids[-1],) if action.parent_handle is None else ()
            self.sequences.queue(BranchSequence(seq, source, params, extra + tuple(head), action.priority,
                                                action.multiplicity, action.lookahead, split_ids, action.seeds))
        self.sequences.track(seq, Physical(state, action.expansion_id, action.priority < 0, self.clock(),
                                           action.multiplicity, tokens=list(head), origin=action.expansion_id))
        state.expansion_seqs.setdefault(action.expansion_id, set()).add(seq)

    def _head_start(self, state: RequestState, action: Expand) -> list[int]:
        """The tokens a child starts from (`Expand.start_from`): its share of what another expansion has
        written so far (FastTTS's head start, chosen by the search); none for every other expansion."""
        if action.start_from is None:
            return []
        written = self.sequences.longest_written(state, action.start_from.expansion_id)
        return action.start_from.prefix_of(written)

    def reprioritize(self, state: RequestState, expansions: Iterable[int], priority: int, resume: bool) -> None:
        for seq in _sequences_of(state, expansions):
            self.sequences.queue(PrioritizeSequence(seq, priority, resume))
            phys = self.sequences.physical[seq]
            phys.speculative = priority < 0
            phys.paused = phys.paused and not resume

    def pause(self, state: RequestState, expansions: Iterable[int]) -> None:
        for seq in _sequences_of(state, expansions):
            self.sequences.queue(PauseSequence(seq))
            self.sequences.physical[seq].paused = True

    def release(self, state: RequestState, handles: Iterable[SequenceId]) -> None:
        """The search is done with these paused candidates' sequences."""
        for handle in handles:
            state.held.discard(handle)
            self.sequences.release(handle)

    def cancel(self, state: RequestState, action: Cancel, metrics: RunMetrics) -> None:
        """Abort the cancelled expansions' sequences and held candidates (their work thrown away)."""
        for expansion in action.expansions:
            for seq in state.expansion_seqs.pop(expansion, set()):
                self.sequences.cancel(seq, metrics)
            state.deferred = [a for a in state.deferred if a.expansion_id != expansion]
        for handle in action.handles:  # held candidates, or a running step stopped alone (partial rejection)
            state.held.discard(handle)
            running = self.sequences.physical.get(handle)
            if running is not None and running.expansion_id is not None:
                state.expansion_seqs.get(running.expansion_id, set()).discard(handle)
            self.sequences.cancel(handle, metrics)


def _sequences_of(state: RequestState, expansions: Iterable[int]) -> list[SequenceId]:
    return [seq for expansion in expansions for seq in state.expansion_seqs.get(expansion, ())]
