"""EngineLoop: the one thread that owns the search runtime, and the thread-safe doorway to it.

The runtime is not thread-safe, so only this thread calls it. Asyncio handlers talk to it through
`submit` and `cancel`, which append commands to an inbox under a condition variable and wake the
thread. The thread loops: take the inbox's commands (sleeping on the condition while there is nothing
to run: never a busy loop), apply them (submit / cancel: a cancel frees the search's KV blocks at
once), run one `runtime.step()` if anything can run, publish an `EngineSnapshot` from `runtime.stats()`.
The loop builds its runtime with its own callbacks (`on_round`, `on_finished`), which hand `RoundProgress`
and `Outcome` events to each request's asyncio queue through `loop.call_soon_threadsafe`, so handlers
simply await them; the runtime keeps no finished history. It uses only the runtime's public surface.

Overload control: a submit is refused (`Refusal`, HTTP 429) once the searches accepted but not yet
admitted by the runtime reach `max_waiting` beyond the runtime's free slots, so the queue is bounded.
If the runtime raises, the loop fails every open request, refuses new ones (503) and stops.

Draining (`drain`, on SIGTERM): new searches are refused with 503 + Retry-After while those already
accepted run to their end (or their time budget); `idle` says when none is left, so the process can exit
with no KV or PRM work left behind (docs/architecture.md, "Serving over HTTP").
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from specscale.model.memory import MIB, process_resident_bytes
from specscale.runtime.runtime import RuntimeStats, SearchRequest, SearchRuntime
from specscale.search.result import SearchResult
from specscale.server.metrics import ServerMetrics

log = logging.getLogger("specscale.server")


# ---- what the engine thread hands to the asyncio side -------------------------------------------------
@dataclass(frozen=True)
class RoundProgress:
    """A round was decided: the best retained path so far and its aggregated score."""

    round: int
    best_path: str
    best_score: float
    retained: int


@dataclass(frozen=True)
class Outcome:
    """The search left the runtime: result (error "cancelled" if it was cancelled), or failure when the
    engine broke down before it finished."""

    result: SearchResult | None
    failure: str | None = None


@dataclass(frozen=True)
class Refusal:
    """A submit that was not accepted: status 429 (queue full, retry later) or 503 (engine down, or the
    server draining: retry on another server); code: the error code the client sees."""

    status: int
    message: str
    code: str
    retry_after_s: int | None = None


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state after the latest tick (read by /health and /metrics from any thread)."""

    ticks: int = 0
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prm_kv_blocks_used: int = 0
    prm_kv_blocks_total: int = 0
    live_sequences: int = 0
    failure: str | None = None


@dataclass(frozen=True)
class StopReport:
    """What the engine thread left when it stopped: searches it had to cancel, whether the runtime still
    had work (a search to admit, generator work, queued PRM scoring) and its last snapshot."""

    cancelled: int
    work_left: bool
    snapshot: EngineSnapshot

    def describe(self) -> str:
        s, work = self.snapshot, "yes" if self.work_left else "no"
        return (f"{self.cancelled} searches cancelled at exit, {s.running} running, {s.kv_blocks_used} generator KV "
                f"blocks in use, {s.live_sequences} live sequences, runtime work left: {work} "
                f"({s.prm_kv_blocks_used} PRM KV blocks hold cached step prefixes)")


class RequestHandle:
    """One submitted search as its handler sees it: events arrive on an asyncio queue of its loop."""

    def __init__(self, request_id: str, preset: str, wants_progress: bool, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.preset = preset
        self.wants_progress = wants_progress
        self.loop = loop
        self.events: asyncio.Queue[RoundProgress | Outcome] = asyncio.Queue()

    def deliver(self, event: RoundProgress | Outcome) -> None:
        """Called on the engine thread."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


# ---- commands into the engine thread -------------------------------------------------------------------
@dataclass(frozen=True)
class _Submit:
    handle: RequestHandle
    request: SearchRequest


@dataclass(frozen=True)
class _Cancel:
    request_id: str
    reason: str
    requested_at_tick: int


@dataclass
class _Inbox:
    commands: deque = field(default_factory=deque)
    submits: int = 0  # _Submit commands in `commands`


class EngineLoop:
    """make_runtime: builds the runtime from its callbacks and options (`Pipeline.runtime`)."""

    def __init__(self, make_runtime: Callable[..., SearchRuntime], metrics: ServerMetrics, max_waiting: int,
                 retry_after_s: int = 1, model_memory: Callable[[], dict] | None = None, kernels: dict | None = None,
                 warm: Callable[[], object] | None = None):
        self._warm = warm  # run first on the engine thread (per-thread kernel caches: model/prefill_warmup.py)
        self.runtime = make_runtime(on_round=self._on_round, on_finished=self._on_finished, keep_finished=False)
        self._model_memory = model_memory  # {"generator": ..., "prm": ...} for /health (Pipeline.model_memory)
        self.kernels = kernels or {}  # machine and kernel paths per model for /health (Pipeline.kernels)
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        stats = self.runtime.stats()
        self._condition = threading.Condition()
        self._inbox = _Inbox()  # guarded by _condition, like the three fields below
        self._runtime_waiting = 0
        self._free_slots = stats.free_slots
        self._stopping = False
        self._draining = False
        self._handles: dict[str, RequestHandle] = {}  # engine thread only
        self._ticks = 0
        self._finished_generated_tokens = 0
        self.left_at_stop: StopReport | None = None  # what the thread left behind when it ended (set once)
        self.snapshot = EngineSnapshot(kv_blocks_total=stats.generator_kv.total_blocks,
                                       prm_kv_blocks_total=stats.verifier_kv.total_blocks)
        self._thread = threading.Thread(target=self._run, name="specscale-engine", daemon=True)

    # ---- lifecycle (any thread) -------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Cancel every open search (their KV freed) and end the thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def drain(self) -> None:
        """Refuse new searches (503 + Retry-After); the accepted ones run on."""
        with self._condition:
            self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    def idle(self) -> bool:
        """No search accepted and unfinished: none in the inbox, waiting or running (as of the latest tick)."""
        with self._condition:
            return self._queued() == 0 and self.snapshot.running == 0 and not self._inbox.commands

    @property
    def failure(self) -> str | None:
        return self.snapshot.failure

    # ---- the asyncio side ---------------------------------------------------------------------------
    def submit(self, request: SearchRequest, preset: str, wants_progress: bool) -> RequestHandle | Refusal:
        """Hand a search to the engine thread (call from the event loop that will await its events)."""
        handle = RequestHandle(request.request_id, preset, wants_progress, asyncio.get_running_loop())
        with self._condition:
            refusal = self._refusal()
            if refusal is not None:
                return refusal
            self._inbox.commands.append(_Submit(handle, request))
            self._inbox.submits += 1
            self._condition.notify()
        return handle

    def refusal(self) -> Refusal | None:
        """What a submit would be refused with now (a cheap check before preparing a search)."""
        with self._condition:
            return self._refusal()

    def _refusal(self) -> Refusal | None:
        if self._stopping or self.snapshot.failure is not None:
            return Refusal(503, f"the engine is not serving: {self.snapshot.failure or 'shutting down'}",
                           "engine_unavailable")
        if self._draining:
            return Refusal(503, "the server is shutting down and finishing the searches it has; retry on another "
                           "server", "draining", retry_after_s=self.retry_after_s)
        if self._queued() - self._free_slots >= self.max_waiting:  # one more would wait beyond the bound
            return Refusal(429, f"the server is at capacity ({self._waiting()} searches waiting for one of "
                           f"{self.runtime.max_concurrency} slots); retry later", "queue_full",
                           retry_after_s=self.retry_after_s)
        return None

    def cancel(self, request_id: str, reason: str) -> None:
        """Ask the engine thread to cancel a search (a no-op once it has finished)."""
        with self._condition:
            self._inbox.commands.append(_Cancel(request_id, reason, self._ticks))
            self._condition.notify()

    def waiting(self) -> int:
        """Searches accepted that will wait for a slot: what `max_waiting` bounds (those about to take a
        free slot are not waiting)."""
        with self._condition:
            return self._waiting()

    def _waiting(self) -> int:
        return max(self._queued() - self._free_slots, 0)

    def _queued(self) -> int:
        return self._runtime_waiting + self._inbox.submits

    # ---- the engine thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._warm is not None:
                self._warm()
            while self._wait_for_work():
                for command in self._take_commands():
                    self._apply(command)
                if self._has_runnable_work():
                    self._tick()
                self._publish()
            cancelled = self._cancel_everything()
            self._publish()
            self.left_at_stop = StopReport(cancelled, self.runtime.can_progress(), self.snapshot)
        except Exception as exc:  # the runtime's state cannot be trusted any more: fail loudly and stop
            log.exception("the engine thread failed; refusing new requests")
            self._fail(f"{type(exc).__name__}: {exc}")

    def _wait_for_work(self) -> bool:
        """Sleep until a command arrives or something can run; False once stopping."""
        with self._condition:
            while not self._inbox.commands and not self._stopping and not self._has_runnable_work():
                self._condition.wait()
            return not self._stopping

    def _take_commands(self) -> list[_Submit | _Cancel]:
        with self._condition:
            commands = list(self._inbox.commands)
            self._inbox.commands.clear()
            self._runtime_waiting += self._inbox.submits  # they are about to enter runtime.waiting
            self._inbox.submits = 0
            return commands

    def _has_runnable_work(self) -> bool:
        """Something a tick would advance: a request to admit, engine work or queued PRM scoring."""
        return self.runtime.can_progress()

    def _apply(self, command: _Submit | _Cancel) -> None:
        if isinstance(command, _Submit):
            self._handles[command.request.request_id] = command.handle
            self.runtime.submit(command.request)
        elif self.runtime.cancel(command.request_id):
            self.metrics.cancellation(command.reason, self._ticks - command.requested_at_tick)

    def _tick(self) -> None:
        self.runtime.step()
        self._ticks += 1
        self._record_verifier_batches()
        active = self.runtime.stats().generated_tokens_in_flight
        self.metrics.generated_total(self._finished_generated_tokens + active)

    def _record_verifier_batches(self) -> None:
        """Fold the runtime's per-run lists into the server's histograms and start them afresh, so a
        server that runs for days keeps no per-tick history."""
        run = self.runtime.take_metrics()
        for items, tokens in zip(run.verifier_batch_items, run.verifier_batch_tokens, strict=True):
            self.metrics.verifier_batch(items, tokens)

    def _publish(self) -> None:
        stats: RuntimeStats = self.runtime.stats()
        with self._condition:
            self._runtime_waiting = stats.waiting
            self._free_slots = stats.free_slots
            self.snapshot = EngineSnapshot(
                ticks=self._ticks, running=stats.running, waiting=self._waiting(),
                kv_blocks_used=stats.generator_kv.used_blocks, kv_blocks_total=stats.generator_kv.total_blocks,
                prm_kv_blocks_used=stats.verifier_kv.used_blocks, prm_kv_blocks_total=stats.verifier_kv.total_blocks,
                live_sequences=stats.live_sequences,
            )

    def memory(self) -> dict:
        """Resident memory: the process's RSS and, when the loop was given `model_memory`, what each model
        holds (model/memory.py); any thread."""
        models = self._model_memory() if self._model_memory is not None else {}
        return {"process_rss_mib": round(process_resident_bytes() / MIB, 1), **models}

    # ---- runtime callbacks (engine thread, inside submit / cancel / step) --------------------------------
    def _on_round(self, request_id: str, decision) -> None:
        handle = self._handles.get(request_id)
        if handle is None or not handle.wants_progress or not decision.retained:
            return
        best_steps, _copies = decision.retained[0]
        handle.deliver(RoundProgress(decision.round, "".join(best_steps), decision.best_score,
                                     len(decision.retained)))

    def _on_finished(self, request_id: str, result: SearchResult) -> None:
        self._finished_generated_tokens += result.usage.generated_tokens
        handle = self._handles.pop(request_id, None)
        if handle is None:
            return
        self.metrics.search_finished(handle.preset, result)
        handle.deliver(Outcome(result))

    # ---- shutdown and failure ----------------------------------------------------------------------------
    def _cancel_everything(self) -> int:
        """Cancel every open search; how many there were."""
        open_ids = list(self._handles)
        for request_id in open_ids:
            self.runtime.cancel(request_id)
        return len(open_ids)

    def _fail(self, reason: str) -> None:
        with self._condition:
            self._stopping = True
            self.snapshot = EngineSnapshot(ticks=self._ticks, kv_blocks_total=self.snapshot.kv_blocks_total,
                                           prm_kv_blocks_total=self.snapshot.prm_kv_blocks_total, failure=reason)
        handles, self._handles = self._handles, {}
        for handle in handles.values():
            handle.deliver(Outcome(None, failure=reason))
