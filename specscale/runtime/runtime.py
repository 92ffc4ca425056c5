"""SearchRuntime: serves many searches at once on one device (one generator engine, one verifier).

Each tick admits waiting searches, then runs either one generator iteration (continuous batching across
every request) or one PRM batch, chosen by the verification queue's policy; generator updates and PRM scores
become events for the searches, whose actions become generator operations (branch / abort / pause /
priorities) and queued verifications. Its parts, one noun each (docs/architecture.md, steps 2 to 10):
`runtime/admission.py` (which searches start: at most `max_concurrency` in flight, the rest wait in order),
`runtime/sequences.py` (the engine sequences it named and the operations not yet handed over),
`runtime/expansions.py` (a search's expansions as sequences), `runtime/generation.py` (a generator iteration
as events), `runtime/prm_batches.py` (Verify actions queued, a PRM batch scored) and `runtime/hand_off.py`
(finished searches to their callers). This module drives the ticks and routes each action to its part.

Time is read only through `clock`, so the same code runs on the real engine (wall clock) and with a
simulated engine (virtual clock). The runtime touches its generator and verifier only through the
protocols of `runtime/backend.py`: at the start of each tick the previous tick's operations and this tick's
admissions go to the generator as one batch (`Sequences.flush`), and so does whatever is pending before the
runtime reads the generator between ticks (`stats`, `can_progress`), returns from `cancel` (a cancelled
search's KV is freed at once) or ends a tick with no request left. The generator sees the same calls in the
same order as if each were made at once.

Public surface: `submit`, `cancel`, `step`, `run` (submit and step until done, the one loop that
`solve`, `bench` and `eval` share), `result` / `search` of finished requests, `stats()`, `metrics` /
`take_metrics()`, and the `on_finished` / `on_round` callbacks given at construction.
"""

from __future__ import annotations

import time as _time
from collections import deque
from collections.abc import Callable

from specscale.runtime.admission import Admission
from specscale.runtime.backend import GeneratorBackend, VerifierBackend
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.expansions import Expansions
from specscale.runtime.generation import Generation
from specscale.runtime.hand_off import HandOff
from specscale.runtime.lazy_flush import FlushSignals
from specscale.runtime.metrics import RunMetrics
from specscale.runtime.prm_batches import PrmBatches, request_of
from specscale.runtime.request_state import RequestState, RuntimeStats, SearchRequest
from specscale.runtime.sequences import Sequences
from specscale.runtime.verify_queue import QueuedStep, VerifyQueue
from specscale.search.protocol import (
    Cancel,
    Cancelled,
    Done,
    Expand,
    Pause,
    Release,
    Resume,
    ScoresArrived,
    SetPriority,
    Verify,
)
from specscale.search.result import AnswerReader, SearchResult
from specscale.search.search import Search

# SearchRequest and RuntimeStats live in runtime/request_state.py; their importers take them from here too.
__all__ = ["RuntimeStats", "SearchRequest", "SearchRuntime"]


class SearchRuntime:
    """keep_finished: keep every finished request's result and search for `result` / `search` (a server
    that runs for days hands results out through on_finished instead). on_finished(request_id,
    SearchResult) runs as a request leaves (cancelled ones too, unless cancelled with notify=False);
    on_round(request_id, Decision) after each decided round. read_answers(SearchResult) fills in a
    finished result's answers and votes (`specscale/answers.py`; the composition root gives it, so that
    `search/` never imports `grading/`); without it results carry paths only. device: the stack's resolved
    device properties (`runtime/device_properties.py`; the runtime reads the LV threshold from it)."""

    def __init__(self, generator: GeneratorBackend, verifier: VerifierBackend, device: DeviceProperties,
                 clock=_time.perf_counter, max_concurrency: int = 32, on_finished: Callable | None = None,
                 on_round: Callable | None = None, keep_finished: bool = True, read_answers: AnswerReader | None = None):
        self.admission = Admission(max_concurrency)
        self.generator = generator
        self.verifier = verifier
        self.clock = clock
        self.device = device
        self.queue = VerifyQueue()
        self.metrics = RunMetrics()
        self.sequences = Sequences(generator, clock)
        self.expansions = Expansions(self.sequences, clock)
        self.generation = Generation(generator, self.sequences, self.expansions, clock)
        self.prm_batches = PrmBatches(verifier, self.queue, self.sequences, clock, device.lv_threshold_tokens)
        self.hand_off = HandOff(clock, keep_finished, on_finished, on_round, read_answers)

    @property
    def max_concurrency(self) -> int:
        return self.admission.max_concurrency

    @property
    def waiting(self) -> deque[RequestState]:
        return self.admission.waiting

    @property
    def active(self) -> dict[str, RequestState]:
        return self.admission.active

    # ---- public API ---------------------------------------------------------------------------------
    def submit(self, request: SearchRequest) -> str:
        if not request.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        request_id = self.admission.request_id(request, self.hand_off.finished)
        flush = self.prm_batches.flush_policy_of(request.config)
        self.admission.wait(RequestState(request_id, request, Search(request.config), self.clock(),
                                             flush_policy=flush))
        return request_id

    def cancel(self, request_id: str, notify: bool = True) -> bool:
        """Cancel a waiting or running request; its KV blocks are freed at once. notify=False: its
        cancelled result does not go to on_finished."""
        waiting = self.admission.withdraw(request_id)
        if waiting is not None:
            waiting.admitted_at = self.clock()
            waiting.search.on(Cancelled(self.clock()))
            self._complete(waiting, notify)
            return True
        state = self.admission.active.get(request_id)
        if state is None:
            return False
        self._apply(state, state.search.on(Cancelled(self.clock())), notify)
        self.sequences.flush()
        return True

    def has_work(self) -> bool:
        return self.admission.has_work()

    def can_progress(self) -> bool:
        """A tick would advance something: a request to admit, generator work or queued PRM scoring."""
        self.sequences.flush()
        return self.admission.can_admit() or self.generator.has_work() or bool(self.queue)

    def step(self) -> list[tuple[str, SearchResult]]:
        """One tick: admit, then one PRM batch or one generator iteration. Returns requests finished."""
        self.hand_off.start_tick()
        self._admit()
        self.sequences.flush()  # the previous tick's operations and this tick's admissions: one batch
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
            self.sequences.flush()
        return self.hand_off.take_tick()

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
        return self.hand_off.finished[request_id].result

    def search(self, request_id: str) -> Search:
        """A finished request's search: its rounds, candidates and decisions (keep_finished runtimes)."""
        return self.hand_off.finished[request_id].search

    def finished_ids(self) -> list[str]:
        return list(self.hand_off.finished)

    def stats(self) -> RuntimeStats:
        self.sequences.flush()
        active = self.admission.active
        return RuntimeStats(
            running=len(active), waiting=len(self.admission.waiting), free_slots=self.admission.free_slots(),
            generated_tokens_in_flight=sum(s.generated_tokens for s in active.values()),
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

    # ---- one tick -----------------------------------------------------------------------------------
    def _admit(self) -> None:
        for state in self.admission.admit_ready(self.clock):
            self.expansions.start_prefix(state)
            self._apply(state, state.search.start(state.admitted_at))

    def _run_generation(self) -> None:
        for update in self.generation.iterate(self.metrics):
            phys = self.sequences.physical.get(update.seq_id)
            if phys is None:
                continue
            event = self.generation.event_of(phys, update, self.metrics)
            if event is not None:
                self._apply(phys.request, phys.request.search.on(event))
        self.metrics.sample_sequences(self.sequences.generating_multiplicities())

    def _run_verification(self, batch: list[QueuedStep]) -> None:
        results, now = self.prm_batches.score(batch, self.metrics)
        for item, result in zip(batch, results, strict=True):
            state = request_of(item)
            if state.request_id in self.admission.active:
                event = ScoresArrived(item.candidate, tuple(result.step_scores), result.error, now)
                self._apply(state, state.search.on(event))

    def _flush_signals(self) -> FlushSignals:
        """What an adaptive lazy-verification policy weighs, read when the queue asks."""
        return self.prm_batches.signals(self.metrics)

    # ---- actions --------------------------------------------------------------------------------------
    def _apply(self, state: RequestState, actions: list, notify: bool = True) -> None:
        """Carry out a search's actions, in order, on the part each one is for."""
        self.hand_off.report_rounds(state)
        for action in actions:
            if isinstance(action, Expand):
                self.expansions.expand(state, action)
            elif isinstance(action, Verify):
                self.prm_batches.enqueue(state, action)
            elif isinstance(action, Cancel):
                self._cancel(state, action)
            elif isinstance(action, Release):
                self.expansions.release(state, action.handles)
            elif isinstance(action, SetPriority):
                self.expansions.reprioritize(state, action.expansions, action.priority, resume=False)
            elif isinstance(action, Pause):
                self.expansions.pause(state, action.expansions)
            elif isinstance(action, Resume):
                self.expansions.reprioritize(state, action.expansions, action.priority, resume=True)
            elif isinstance(action, Done):
                self._complete(state, notify)

    def _cancel(self, state: RequestState, action: Cancel) -> None:
        self.expansions.cancel(state, action, self.metrics)
        if action.candidates:  # pruned before their turn at the PRM: never verify them
            self.queue.drop_candidates(state, set(action.candidates))

    def _complete(self, state: RequestState, notify: bool = True) -> None:
        self.admission.leave(state)
        self.queue.drop_request(state)
        for seq in self.sequences.of_request(state):  # the search released everything; this only guards leaks
            self.sequences.cancel(seq, self.metrics)
        self.hand_off.write_result(state)
        self.metrics.add_waiting(state.search.round_waiting)
        self.hand_off.deliver(state, notify)
