"""SearchRuntime: serves many searches at once on one device (one generator engine, one verifier).

Each tick runs either one generator iteration (continuous batching across every request) or one PRM
batch, chosen by the verification queue's policy; engine outputs and PRM scores become events for
the searches, whose actions become engine calls (fork / extend / abort / pause / priorities) and
queued verifications. At most `max_concurrency` requests are in flight; the rest wait in order.

Time is read only through `clock`, so the same code runs on the real engine (wall clock) and with a
simulated engine (virtual clock). Generator and verifier are duck-typed: `Engine` and `Verifier`
in production, scripted fakes in tests.
"""

from __future__ import annotations

import itertools
import random
import time as _time
from collections import deque
from dataclasses import dataclass, field

from specscale.config import SearchConfig
from specscale.engine.sequence import FinishReason, SamplingParams, SequenceStatus
from specscale.search.metrics import RunMetrics
from specscale.search.protocol import (
    Cancel, Cancelled, Done, Expand, GenerationLost, Pause, Release, Resume, ScoresArrived, SetPriority,
    StepFinished, Verify,
)
from specscale.search.result import SearchResult, Timings, Usage
from specscale.search.search import Search
from specscale.search.verify_queue import QueuedStep, VerifyQueue
from specscale.verify.prm import ScoreRequest

STEP_DELIMITER = "\n\n"


@dataclass(frozen=True)
class SearchRequest:
    """question: what the PRM sees; prompt_ids: the generator's prompt (chat template applied)."""

    question: str
    prompt_ids: list[int]
    config: SearchConfig
    request_id: str | None = None


@dataclass(eq=False)
class Physical:
    """An engine sequence this runtime started: whose it is and the tokens of its current step."""

    request: "RequestState"
    expansion_id: int | None  # None once it holds a finished candidate (or for the prompt prefix)
    speculative: bool
    created_at: float
    tokens: list[int] = field(default_factory=list)
    origin: int | None = None  # the expansion it was started for (kept once it holds a candidate)


@dataclass(eq=False)
class RequestState:
    request_id: str
    request: SearchRequest
    search: Search
    submitted_at: float
    admitted_at: float = 0.0
    prefix_seq: int | None = None  # the prompt, prefilled once and forked for round 0
    deferred: list[Expand] = field(default_factory=list)  # round-0 expansions waiting for the prefix
    expansion_seqs: dict[int, set[int]] = field(default_factory=dict)
    held: set[int] = field(default_factory=set)  # paused sequences of candidates
    generated_tokens: int = 0
    wasted_tokens: int = 0
    generation_s: float = 0.0
    verification_s: float = 0.0
    rounds_reported: int = 0
    result: SearchResult | None = None

    @property
    def config(self) -> SearchConfig:
        return self.request.config


class SearchRuntime:
    def __init__(self, engine, verifier, clock=_time.perf_counter, max_concurrency: int = 32,
                 lv_threshold_tokens: int = 2048, on_finished=None, on_round=None):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.engine = engine
        self.verifier = verifier
        self.clock = clock
        self.max_concurrency = max_concurrency
        self.lv_threshold_tokens = lv_threshold_tokens
        self.queue = VerifyQueue()
        self.metrics = RunMetrics()
        self.waiting: deque[RequestState] = deque()
        self.active: dict[str, RequestState] = {}
        self.finished: dict[str, RequestState] = {}
        self.physical: dict[int, Physical] = {}
        self.on_finished = on_finished  # optional callback(request_id, SearchResult)
        self.on_round = on_round  # optional callback(request_id, Decision) after each decided round
        self._ids = itertools.count()

    # ---- public API ---------------------------------------------------------------------------------
    def submit(self, request: SearchRequest) -> str:
        if not request.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        request_id = request.request_id or f"req-{next(self._ids)}"
        if request_id in self.active or request_id in self.finished or any(
                r.request_id == request_id for r in self.waiting):
            raise ValueError(f"request id {request_id!r} is already used")
        self.waiting.append(RequestState(request_id, request, Search(request.config), self.clock()))
        return request_id

    def cancel(self, request_id: str) -> bool:
        """Cancel a waiting or running request; its KV blocks are freed at once."""
        waiting = next((s for s in self.waiting if s.request_id == request_id), None)
        if waiting is not None:
            self.waiting.remove(waiting)
            waiting.admitted_at = self.clock()
            waiting.search.on(Cancelled(self.clock()))
            self._complete(waiting)
            return True
        state = self.active.get(request_id)
        if state is None:
            return False
        self._apply(state, state.search.on(Cancelled(self.clock())))
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    def step(self) -> list[tuple[str, SearchResult]]:
        """One tick: admit, then one PRM batch or one generator iteration. Returns requests finished."""
        before = len(self.finished)
        self._admit()
        batch = self.queue.ready_batch(self.clock())
        if batch:
            self._run_verification(batch)
        elif self.engine.has_work():
            self._run_generation()
        elif self.queue:
            self._run_verification(self.queue.any_batch())
        self.queue.count_deferral()
        self.metrics.sample_blocks(self.engine.block_manager.num_used_blocks)
        done = list(self.finished.values())[before:]
        return [(s.request_id, s.result) for s in done]

    def run(self, requests: list[SearchRequest], max_ticks: int = 10_000_000) -> list[SearchResult]:
        """Serve these requests to completion; results in submission order."""
        ids = [self.submit(r) for r in requests]
        for _ in range(max_ticks):
            if not self.has_work():
                break
            self.step()
        return [self.finished[i].result for i in ids]

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
        seq = self.engine.add(prompt[:-1], None, readout_positions=[len(prompt) - 2])
        state.prefix_seq = seq
        self.physical[seq] = Physical(state, None, False, self.clock())

    # ---- generation -----------------------------------------------------------------------------------
    def _run_generation(self) -> None:
        start = self.clock()
        outputs = self.engine.step()
        elapsed = self.clock() - start
        self.metrics.generation_s += elapsed
        self._register_splits(outputs)
        touched = {self.physical[o.seq_id].request for o in outputs if o.seq_id in self.physical}
        for state in touched:
            state.generation_s += elapsed
        for out in outputs:
            phys = self.physical.get(out.seq_id)
            if phys is not None:
                self._on_output(phys, out)
        self.metrics.sample_sequences(self._generating_multiplicities())

    def _register_splits(self, outputs) -> None:
        """CD: a sequence split this iteration; the child inherits the parent's step so far."""
        for out in outputs:
            parent = self.physical.get(out.parent_id) if out.parent_id is not None else None
            if parent is None:
                continue
            child = Physical(parent.request, parent.expansion_id, parent.speculative, self.clock(), list(parent.tokens),
                             parent.origin)
            self.physical[out.seq_id] = child
            parent.request.expansion_seqs.setdefault(parent.expansion_id, set()).add(out.seq_id)

    def _on_output(self, phys: Physical, out) -> None:
        state = phys.request
        if out.finish_reason == FinishReason.READOUT:
            self._on_prefix_ready(state)
            return
        phys.tokens += out.new_token_ids
        state.generated_tokens += len(out.new_token_ids)
        if out.status in (SequenceStatus.RUNNING, SequenceStatus.WAITING):
            return
        now = self.clock()
        expansion = phys.expansion_id
        state.expansion_seqs.get(expansion, set()).discard(out.seq_id)
        if out.finish_reason == FinishReason.PREEMPTED:
            self._forget(out.seq_id, cancelled=True)
            self._apply(state, state.search.on(GenerationLost(expansion, out.lane_ids, now)))
            return
        completed = out.status == SequenceStatus.FINISHED
        if completed:
            self.physical.pop(out.seq_id, None)
        else:
            phys.expansion_id = None
            state.held.add(out.seq_id)
        text = self.engine.tokenizer.decode(phys.tokens)
        truncated = out.finish_reason in (FinishReason.LENGTH, FinishReason.CONTEXT)
        event = StepFinished(expansion, None if completed else out.seq_id, text, len(phys.tokens),
                             out.lane_ids, completed, now, "length" if truncated else "stop")
        self._apply(state, state.search.on(event))

    def _on_prefix_ready(self, state: RequestState) -> None:
        deferred, state.deferred = state.deferred, []
        for action in deferred:
            self._start_expansion(state, action)
        self._forget(state.prefix_seq, cancelled=False)
        state.prefix_seq = None

    def _generating_multiplicities(self) -> list[int]:
        out = []
        for seq_id, phys in self.physical.items():
            if phys.expansion_id is not None:
                seq = self.engine.get(seq_id)
                if seq is not None and seq.status in (SequenceStatus.RUNNING, SequenceStatus.WAITING):
                    out.append(seq.multiplicity)
        return out

    # ---- verification ---------------------------------------------------------------------------------
    def _run_verification(self, batch: list[QueuedStep]) -> None:
        start = self.clock()
        results = self.verifier.score([item.score_request for item in batch])
        now = self.clock()
        self.metrics.verification_s += now - start
        self.metrics.verifier_call(len(batch), sum(item.tokens for item in batch))
        for state in {item.request for item in batch}:
            state.verification_s += now - start
        for item, result in zip(batch, results):
            state = item.request
            if state.request_id in self.active:
                event = ScoresArrived(item.candidate, tuple(result.step_scores), result.error, now)
                self._apply(state, state.search.on(event))

    def _enqueue(self, state: RequestState, action: Verify) -> None:
        request = ScoreRequest(state.request.question, action.steps)
        config = state.config
        self.queue.push(QueuedStep(
            state, action.candidate, request, action.completes_group, config.verification,
            self.verifier.tokens_to_compute(request), self.clock(), self._lv_threshold(config),
            config.lv_max_deferrals, config.lv_max_age_s,
        ))

    def _lv_threshold(self, config: SearchConfig) -> int:
        """The one place a request's lazy-verification threshold is resolved: its own override, else the
        runtime's (the profiled knee of this PRM and device, or the pipeline's default)."""
        return config.lv_threshold_tokens if config.lv_threshold_tokens is not None else self.lv_threshold_tokens

    # ---- actions --------------------------------------------------------------------------------------
    def _apply(self, state: RequestState, actions: list) -> None:
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
                self._for_expansions(state, action.expansions, lambda s: self.engine.set_priority(s, action.priority))
            elif isinstance(action, Pause):
                self._for_expansions(state, action.expansions, self.engine.pause)
            elif isinstance(action, Resume):
                self._for_expansions(state, action.expansions, lambda s: self._resume(s, action.priority))
            elif isinstance(action, Done):
                self._complete(state)

    def _report_rounds(self, state: RequestState) -> None:
        decisions = state.search.decisions
        while state.rounds_reported < len(decisions):
            if self.on_round is not None:
                self.on_round(state.request_id, decisions[state.rounds_reported])
            state.rounds_reported += 1

    def _for_expansions(self, state: RequestState, expansions, call) -> None:
        for expansion in expansions:
            for seq in state.expansion_seqs.get(expansion, ()):
                engine_seq = self.engine.get(seq)
                if engine_seq is None:  # it finished in this iteration; its output is still to come
                    continue
                call(seq)
                self.physical[seq].speculative = engine_seq.priority < 0

    def _resume(self, seq: int, priority: int) -> None:
        if self.engine.get(seq).status == SequenceStatus.PAUSED:  # a pause may not have happened
            self.engine.resume(seq, priority)
        else:
            self.engine.set_priority(seq, priority, abort_on_preempt=False)

    def _expand(self, state: RequestState, action: Expand) -> None:
        if action.parent_handle is None and state.prefix_seq is not None:
            state.deferred.append(action)  # round 0 waits until the prompt is prefilled
            return
        self._start_expansion(state, action)

    def _start_expansion(self, state: RequestState, action: Expand) -> None:
        config = state.config
        params = SamplingParams(
            temperature=config.temperature, top_p=config.top_p, seed=action.seeds[0] if action.seeds else None,
            max_new_tokens=config.max_step_tokens, stop=() if action.final_round else (STEP_DELIMITER,),
        )
        source = action.parent_handle if action.parent_handle is not None else state.prefix_seq
        head = self._head_start(state, action)
        if source is None:  # a one-token prompt: nothing to share
            seq = self.engine.add(state.request.prompt_ids, params, priority=action.priority,
                                  multiplicity=action.multiplicity, abort_on_preempt=action.lookahead,
                                  lane_seeds=action.seeds)
        else:
            seq = self.engine.fork(source, 1)[0]
            extra = [state.request.prompt_ids[-1]] if action.parent_handle is None else []
            self.engine.extend(seq, params, token_ids=extra + head, priority=action.priority,
                               multiplicity=action.multiplicity, abort_on_preempt=action.lookahead,
                               lane_seeds=action.seeds)
        self.physical[seq] = Physical(state, action.expansion_id, action.priority < 0, self.clock(), list(head),
                                      action.expansion_id)
        state.expansion_seqs.setdefault(action.expansion_id, set()).add(seq)

    def _head_start(self, state: RequestState, action: Expand) -> list[int]:
        """FastTTS's truncation of a duplicate's head start: of the tokens the continuation
        `action.head_start_of` has written so far, keep a share r ~ Normal(lookahead_head_start,
        lookahead_head_start_std) clipped to [0, 1] -- at least one token, and at least one token fewer
        than written (docs/design.md, "Speculation"). r is drawn from the child's own seed."""
        if action.head_start_of is None:
            return []
        written = max((p.tokens for p in self.physical.values()
                       if p.request is state and p.origin == action.head_start_of), key=len, default=[])
        config = state.config
        draw = random.Random(action.seeds[0] if action.seeds else action.expansion_id)
        share = min(max(draw.gauss(config.lookahead_head_start, config.lookahead_head_start_std), 0.0), 1.0)
        return written[: min(max(int(share * len(written)), 1), len(written) - 1)]

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

    def _forget(self, seq: int, cancelled: bool) -> None:
        """Abort an engine sequence (its unshared blocks are freed at once) and account for it."""
        phys = self.physical.pop(seq, None)
        self.engine.abort(seq)
        if phys is None or not cancelled:
            return
        self.metrics.cancelled(len(phys.tokens), self.clock() - phys.created_at)
        if phys.speculative:
            phys.request.wasted_tokens += len(phys.tokens)

    # ---- completion -----------------------------------------------------------------------------------
    def _complete(self, state: RequestState) -> None:
        self.active.pop(state.request_id, None)
        self.queue.drop_request(state)
        leftovers = [seq for seq, phys in self.physical.items() if phys.request is state]
        for seq in leftovers:  # the search released everything; this only guards against leaks
            self._forget(seq, cancelled=True)
        state.result = state.search.result
        state.result.usage = self._usage(state)
        state.result.timings = self._timings(state)
        self.metrics.add_waiting(state.search.round_waiting)
        self.finished[state.request_id] = state
        if self.on_finished is not None:
            self.on_finished(state.request_id, state.result)

    def _usage(self, state: RequestState) -> Usage:
        output = sum(p.num_tokens * p.copies for p in state.search.result.paths)
        return Usage(len(state.request.prompt_ids), output, state.generated_tokens, state.wasted_tokens)

    def _timings(self, state: RequestState) -> Timings:
        now = self.clock()
        in_flight = now - state.admitted_at
        other = max(in_flight - state.generation_s - state.verification_s, 0.0)
        return Timings(state.admitted_at - state.submitted_at, state.generation_s, state.verification_s,
                       other, now - state.submitted_at)
