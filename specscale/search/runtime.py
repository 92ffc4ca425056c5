"""SearchRuntime: serves many searches at once on one device (one generator engine, one verifier).

Each tick runs either one generator iteration (continuous batching across every request) or one PRM
batch, chosen by the verification queue's policy; generator updates and PRM scores become events for
the searches, whose actions become generator operations (branch / abort / pause / priorities) and
queued verifications. At most `max_concurrency` requests are in flight; the rest wait in order.

Time is read only through `clock`, so the same code runs on the real engine (wall clock) and with a
simulated engine (virtual clock). The runtime touches its generator and verifier only through the
protocols of `search/backend.py`: it names every sequence and queues the operations the searches' actions
become; at the start of each tick the previous tick's operations and this tick's admissions go to the
generator as one batch (`_flush`), and so does whatever is pending before the runtime reads the generator
between ticks (`stats`, `can_progress`), returns from `cancel` (a cancelled search's KV is freed at once) or
ends a tick with no request left. The generator sees the same calls in the same order as if each were made
at once.

Public surface: `submit`, `cancel`, `step`, `run` (submit and step until done, the one loop that
`solve`, `bench` and `eval` share), `result` / `search` of finished requests, `stats()`, `metrics` /
`take_metrics()`, and the `on_finished` / `on_round` callbacks given at construction.
"""

from __future__ import annotations

import itertools
import time as _time
from collections import deque
from collections.abc import Callable
from typing import cast

from specscale.prompts import STEP_SEPARATOR
from specscale.seam import (
    AbortSequence,
    BranchSequence,
    PauseSequence,
    PrioritizeSequence,
    SamplingParams,
    ScoreRequest,
    SequenceId,
    SequenceOp,
    SequenceState,
    SequenceUpdate,
    StartSequence,
)
from specscale.search.backend import GeneratorBackend, VerifierBackend
from specscale.search.lazy_flush import FlushSignals, flush_policy
from specscale.search.lookahead import head_start
from specscale.search.metrics import RunMetrics
from specscale.search.protocol import (
    Cancel,
    Cancelled,
    Done,
    Expand,
    GenerationLost,
    Pause,
    Release,
    Resume,
    ScoresArrived,
    SetPriority,
    StepFinished,
    Verify,
)
from specscale.search.request_state import (
    Physical,
    RequestState,
    RuntimeStats,
    SearchRequest,
    timings_of,
    usage_of,
)
from specscale.search.result import AnswerReader, SearchResult
from specscale.search.search import Search
from specscale.search.verification import VERIFICATIONS
from specscale.search.verify_queue import QueuedStep, VerifyQueue
from specscale.verify.profile import DEFAULT_LV_THRESHOLD


class SearchRuntime:
    """keep_finished: keep every finished request's result and search for `result` / `search` (a server
    that runs for days hands results out through on_finished instead). on_finished(request_id,
    SearchResult) runs as a request leaves (cancelled ones too, unless cancelled with notify=False);
    on_round(request_id, Decision) after each decided round. read_answers(SearchResult) fills in a
    finished result's answers and votes (`specscale/answers.py`; the composition roots give it, so that
    `search/` never imports `grading/`); without it results carry paths only."""

    def __init__(self, generator: GeneratorBackend, verifier: VerifierBackend, clock=_time.perf_counter,
                 max_concurrency: int = 32, lv_threshold_tokens: int = DEFAULT_LV_THRESHOLD,
                 on_finished: Callable | None = None, on_round: Callable | None = None, keep_finished: bool = True,
                 read_answers: AnswerReader | None = None):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.generator = generator
        self.verifier = verifier
        self.clock = clock
        self.max_concurrency = max_concurrency
        self.lv_threshold_tokens = lv_threshold_tokens
        self.queue = VerifyQueue()
        self.metrics = RunMetrics()
        self.waiting: deque[RequestState] = deque()
        self.active: dict[str, RequestState] = {}
        self.physical: dict[SequenceId, Physical] = {}
        self._finished: dict[str, RequestState] = {}
        self._just_finished: list[RequestState] = []
        self._keep_finished = keep_finished
        self._on_finished = on_finished
        self._on_round = on_round
        self._read_answers = read_answers
        self._ids = itertools.count()
        self._seq_ids = itertools.count()
        self._ops: list[SequenceOp] = []  # this tick's operations, not yet handed to the generator

    # ---- public API ---------------------------------------------------------------------------------
    def submit(self, request: SearchRequest) -> str:
        if not request.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        request_id = request.request_id or f"req-{next(self._ids)}"
        if request_id in self.active or request_id in self._finished or any(
                r.request_id == request_id for r in self.waiting):
            raise ValueError(f"request id {request_id!r} is already used")
        self.waiting.append(RequestState(request_id, request, Search(request.config), self.clock()))
        return request_id

    def cancel(self, request_id: str, notify: bool = True) -> bool:
        """Cancel a waiting or running request; its KV blocks are freed at once. notify=False: its
        cancelled result does not go to on_finished."""
        waiting = next((s for s in self.waiting if s.request_id == request_id), None)
        if waiting is not None:
            self.waiting.remove(waiting)
            waiting.admitted_at = self.clock()
            waiting.search.on(Cancelled(self.clock()))
            self._complete(waiting, notify)
            return True
        state = self.active.get(request_id)
        if state is None:
            return False
        self._apply(state, state.search.on(Cancelled(self.clock())), notify)
        self._flush()
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    def can_progress(self) -> bool:
        """A tick would advance something: a request to admit, generator work or queued PRM scoring."""
        self._flush()
        admittable = bool(self.waiting) and len(self.active) < self.max_concurrency
        return admittable or self.generator.has_work() or bool(self.queue)

    def step(self) -> list[tuple[str, SearchResult]]:
        """One tick: admit, then one PRM batch or one generator iteration. Returns requests finished."""
        self._just_finished = []
        self._admit()
        self._flush()  # the previous tick's operations and this tick's admissions: one batch
        self.metrics.sample_blocks(self.generator.kv_usage.used_blocks)  # new sequences hold no blocks yet
        batch = self.queue.ready_batch(self.clock(), self._flush_signals)
        if batch:
            self._run_verification(batch)
        elif self.generator.has_work():
            self._run_generation()
        elif self.queue:
            self._run_verification(self.queue.any_batch())
        self.queue.count_deferral()
        if not self.has_work():  # the last tick: nothing will come to batch its operations with
            self._flush()
        done, self._just_finished = self._just_finished, []
        return [(s.request_id, s.result) for s in done]

    def run(self, requests: list[SearchRequest], progress: Callable[[int], object] | None = None,
            max_ticks: int = 10_000_000) -> list[SearchResult]:
        """Submit these requests and step until every request is done; results in submission order.
        progress(n) is told how many requests each tick finished."""
        ids = [self.submit(r) for r in requests]
        results: dict[str, SearchResult] = {}
        for _ in range(max_ticks):
            if not self.has_work():
                break
            finished = self.step()
            results.update(finished)
            if progress is not None and finished:
                progress(len(finished))
        return [results[i] for i in ids]

    def result(self, request_id: str) -> SearchResult:
        """A finished request's result (keep_finished runtimes)."""
        return self._finished[request_id].result

    def search(self, request_id: str) -> Search:
        """A finished request's search: its rounds, candidates and decisions (keep_finished runtimes)."""
        return self._finished[request_id].search

    def finished_ids(self) -> list[str]:
        return list(self._finished)

    def stats(self) -> RuntimeStats:
        self._flush()
        return RuntimeStats(
            running=len(self.active), waiting=len(self.waiting),
            free_slots=max(self.max_concurrency - len(self.active), 0),
            generated_tokens_in_flight=sum(s.generated_tokens for s in self.active.values()),
            live_sequences=self.generator.num_live_sequences, generator_kv=self.generator.kv_usage,
            verifier_kv=self.verifier.kv_usage,
        )

    def take_metrics(self) -> RunMetrics:
        """The metrics so far; the runtime starts afresh (a long-running server keeps no history)."""
        metrics, self.metrics = self.metrics, RunMetrics()
        return metrics

    @property
    def flush_reasons(self) -> dict[str, int]:
        """Why each lazy-verification batch was flushed, counted."""
        return dict(self.queue.flush_reasons)

    # ---- admission ----------------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.max_concurrency:
            state = self.waiting.popleft()
            state.admitted_at = self.clock()
            self.active[state.request_id] = state
            self._start_prefix(state)
            self._apply(state, state.search.start(state.admitted_at))

    def _start_prefix(self, state: RequestState) -> None:
        """Prefill the prompt once (all but its last token); round 0 forks it."""
        prompt = state.request.prompt_ids
        if len(prompt) < 2:
            return
        seq, _ = self._new_sequence(1)
        self._ops.append(StartSequence(seq, tuple(prompt[:-1]), None, readout_positions=(len(prompt) - 2,)))
        state.prefix_seq = seq
        self.physical[seq] = Physical(state, None, False, self.clock())

    def _new_sequence(self, multiplicity: int) -> tuple[SequenceId, tuple[SequenceId, ...]]:
        """A new sequence id and the ids reserved for the rows it may split into (CD)."""
        return next(self._seq_ids), tuple(next(self._seq_ids) for _ in range(multiplicity - 1))

    def _flush(self) -> None:
        """Hand the queued operations to the generator as one batch."""
        if self._ops:
            ops, self._ops = self._ops, []
            self.generator.apply(ops)

    # ---- generation -----------------------------------------------------------------------------------
    def _run_generation(self) -> None:
        start = self.clock()
        updates = self.generator.step()
        elapsed = self.clock() - start
        self.metrics.generation_s += elapsed
        self._register_splits(updates)
        touched = {self.physical[u.seq_id].request for u in updates if u.seq_id in self.physical}
        for state in touched:
            state.generation_s += elapsed
        for update in updates:
            phys = self.physical.get(update.seq_id)
            if phys is not None:
                self._on_update(phys, update)
        self.metrics.sample_sequences(self._generating_multiplicities())

    def _register_splits(self, updates: list[SequenceUpdate]) -> None:
        """CD: a sequence split this iteration; the child inherits the parent's step so far."""
        for update in updates:
            parent = self.physical.get(update.split_from) if update.split_from is not None else None
            if parent is None:
                continue
            child = Physical(parent.request, parent.expansion_id, parent.speculative, self.clock(),
                             update.multiplicity, parent.paused, list(parent.tokens), parent.origin)
            self.physical[update.seq_id] = child
            parent.request.expansion_seqs.setdefault(parent.expansion_id, set()).add(update.seq_id)

    def _on_update(self, phys: Physical, update: SequenceUpdate) -> None:
        state = phys.request
        if update.state == SequenceState.READOUT:
            self._on_prefix_ready(state)
            return
        phys.tokens += update.new_token_ids
        phys.multiplicity = update.multiplicity
        state.generated_tokens += len(update.new_token_ids)
        if update.state == SequenceState.GENERATING:
            return
        now = self.clock()
        expansion = phys.expansion_id
        state.expansion_seqs.get(expansion, set()).discard(update.seq_id)
        if update.state == SequenceState.LOST:  # the backend freed it already
            self._account_cancelled(self.physical.pop(update.seq_id))
            self._apply(state, state.search.on(GenerationLost(expansion, update.lane_ids, now)))
            return
        completed = update.state == SequenceState.FINISHED
        if completed:
            self.physical.pop(update.seq_id, None)
        else:
            phys.expansion_id = None
            state.held.add(update.seq_id)
        text = self.generator.decode(phys.tokens)
        event = StepFinished(expansion, None if completed else update.seq_id, text, len(phys.tokens),
                             update.lane_ids, completed, now, update.end_reason.value)
        self._apply(state, state.search.on(event))

    def _on_prefix_ready(self, state: RequestState) -> None:
        deferred, state.deferred = state.deferred, []
        for action in deferred:
            self._start_expansion(state, action)
        self._forget(state.prefix_seq, cancelled=False)
        state.prefix_seq = None

    def _generating_multiplicities(self) -> list[int]:
        return [p.multiplicity for p in self.physical.values() if p.expansion_id is not None and not p.paused]

    # ---- verification ---------------------------------------------------------------------------------
    def _run_verification(self, batch: list[QueuedStep]) -> None:
        start = self.clock()
        results = self.verifier.score([item.score_request for item in batch])
        now = self.clock()
        self.metrics.verification_s += now - start
        requests = {_state(item) for item in batch}
        self.metrics.verifier_call(len(batch), sum(item.tokens for item in batch), len(requests))
        for state in requests:
            state.verification_s += now - start
        for item, result in zip(batch, results, strict=True):
            state = _state(item)
            if state.request_id in self.active:
                event = ScoresArrived(item.candidate, tuple(result.step_scores), result.error, now)
                self._apply(state, state.search.on(event))

    def _enqueue(self, state: RequestState, action: Verify) -> None:
        request = ScoreRequest(state.request.question, action.steps)
        config = state.config
        verification = VERIFICATIONS[config.verification]
        policy = flush_policy(config, self.lv_threshold_tokens) if verification.is_lazy else None
        self.queue.push(QueuedStep(
            state, action.candidate, request, action.completes_group, verification.batching,
            self.verifier.tokens_to_compute(request), self.clock(), policy,
        ))

    def _flush_signals(self) -> FlushSignals:
        """What an adaptive lazy-verification policy weighs (search/lazy_flush.py), read now."""
        kv = self.generator.kv_usage
        calls = len(self.metrics.verifier_batch_items)
        speculative: dict[int, int] = {}
        for phys in self.physical.values():
            if phys.speculative:
                speculative[id(phys.request)] = speculative.get(id(phys.request), 0) + len(phys.tokens)
        return FlushSignals(kv.used_blocks / kv.total_blocks if kv.total_blocks else 0.0,
                            self.metrics.verification_s / calls if calls else None, speculative)

    # ---- actions --------------------------------------------------------------------------------------
    def _apply(self, state: RequestState, actions: list, notify: bool = True) -> None:
        self._report_rounds(state)
        for action in actions:
            if isinstance(action, Expand):
                self._expand(state, action)
            elif isinstance(action, Verify):
                self._enqueue(state, action)
            elif isinstance(action, Cancel):
                self._cancel(state, action)
            elif isinstance(action, Release):
                for handle in action.handles:
                    state.held.discard(handle)
                    self._forget(handle, cancelled=False)
            elif isinstance(action, SetPriority):
                self._reprioritize(state, action.expansions, action.priority, resume=False)
            elif isinstance(action, Pause):
                self._pause(state, action.expansions)
            elif isinstance(action, Resume):
                self._reprioritize(state, action.expansions, action.priority, resume=True)
            elif isinstance(action, Done):
                self._complete(state, notify)

    def _report_rounds(self, state: RequestState) -> None:
        decisions = state.search.decisions
        while state.rounds_reported < len(decisions):
            if self._on_round is not None:
                self._on_round(state.request_id, decisions[state.rounds_reported])
            state.rounds_reported += 1

    def _sequences_of(self, state: RequestState, expansions) -> list[SequenceId]:
        return [seq for expansion in expansions for seq in state.expansion_seqs.get(expansion, ())]

    def _reprioritize(self, state: RequestState, expansions, priority: int, resume: bool) -> None:
        for seq in self._sequences_of(state, expansions):
            self._ops.append(PrioritizeSequence(seq, priority, resume))
            phys = self.physical[seq]
            phys.speculative = priority < 0
            phys.paused = phys.paused and not resume

    def _pause(self, state: RequestState, expansions) -> None:
        for seq in self._sequences_of(state, expansions):
            self._ops.append(PauseSequence(seq))
            self.physical[seq].paused = True

    def _expand(self, state: RequestState, action: Expand) -> None:
        if action.parent_handle is None and state.prefix_seq is not None:
            state.deferred.append(action)  # round 0 waits until the prompt is prefilled
            return
        self._start_expansion(state, action)

    def _start_expansion(self, state: RequestState, action: Expand) -> None:
        config = state.config
        params = SamplingParams(
            temperature=config.temperature, top_p=config.top_p, seed=action.seeds[0] if action.seeds else None,
            max_new_tokens=config.max_step_tokens, stop=() if action.final_round else (STEP_SEPARATOR,),
        )
        seq, split_ids = self._new_sequence(action.multiplicity)
        source = action.parent_handle if action.parent_handle is not None else state.prefix_seq
        head = self._head_start(state, action)
        if source is None:  # a one-token prompt: nothing to share
            self._ops.append(StartSequence(seq, tuple(state.request.prompt_ids), params, action.priority,
                                           action.multiplicity, (), action.lookahead, split_ids, action.seeds))
        else:
            extra = (state.request.prompt_ids[-1],) if action.parent_handle is None else ()
            self._ops.append(BranchSequence(seq, source, params, extra + tuple(head), action.priority,
                                            action.multiplicity, action.lookahead, split_ids, action.seeds))
        self.physical[seq] = Physical(state, action.expansion_id, action.priority < 0, self.clock(),
                                      action.multiplicity, tokens=list(head), origin=action.expansion_id)
        state.expansion_seqs.setdefault(action.expansion_id, set()).add(seq)

    def _head_start(self, state: RequestState, action: Expand) -> list[int]:
        """The tokens a child starts from: FastTTS's truncated head start (`search/lookahead.py`) of what the
        continuation `action.head_start_of` has written so far; none for every other expansion."""
        if action.head_start_of is None:
            return []
        written = max((p.tokens for p in self.physical.values()
                       if p.request is state and p.origin == action.head_start_of), key=len, default=[])
        return head_start(written, state.config, action.seeds[0] if action.seeds else action.expansion_id)

    def _cancel(self, state: RequestState, action: Cancel) -> None:
        for expansion in action.expansions:
            for seq in state.expansion_seqs.pop(expansion, set()):
                self._forget(seq, cancelled=True)
            state.deferred = [a for a in state.deferred if a.expansion_id != expansion]
        for handle in action.handles:
            state.held.discard(handle)
            self._forget(handle, cancelled=True)
        if action.candidates:  # pruned before their turn at the PRM: never verify them
            self.queue.drop_candidates(state, set(action.candidates))

    def _forget(self, seq: SequenceId, cancelled: bool) -> None:
        """Abort a sequence (its unshared blocks are freed when the tick's operations are applied) and
        account for it."""
        phys = self.physical.pop(seq, None)
        self._ops.append(AbortSequence(seq))
        if phys is not None and cancelled:
            self._account_cancelled(phys)

    def _account_cancelled(self, phys: Physical) -> None:
        self.metrics.cancelled(len(phys.tokens), self.clock() - phys.created_at)
        if phys.speculative:
            phys.request.wasted_tokens += len(phys.tokens)

    # ---- completion -----------------------------------------------------------------------------------
    def _complete(self, state: RequestState, notify: bool = True) -> None:
        self.active.pop(state.request_id, None)
        self.queue.drop_request(state)
        leftovers = [seq for seq, phys in self.physical.items() if phys.request is state]
        for seq in leftovers:  # the search released everything; this only guards against leaks
            self._forget(seq, cancelled=True)
        state.result = state.search.result
        if self._read_answers is not None:
            self._read_answers(state.result)
        state.result.usage = usage_of(state)
        state.result.timings = timings_of(state, self.clock())
        self.metrics.add_waiting(state.search.round_waiting)
        if self._keep_finished:
            self._finished[state.request_id] = state
        self._just_finished.append(state)
        if notify and self._on_finished is not None:
            self._on_finished(state.request_id, state.result)


def _state(item: QueuedStep) -> RequestState:
    """The request state a queued step belongs to (typed `object` in the queue, which cannot import it)."""
    return cast(RequestState, item.request)
