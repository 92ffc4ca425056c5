"""ServerMetrics: the serving counters and histograms, rendered in the Prometheus text format (`/metrics`).

Written from two threads (the engine thread records finished searches, verifier batches and
cancellations; the asyncio handlers record HTTP statuses and latencies), so every write and the
rendering hold one lock. Gauges of the engine's state (running, waiting, KV blocks) come from the
engine loop's latest `EngineSnapshot` at render time.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass

from specscale.server.errors import CLIENT_CLOSED

LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BATCH_ITEM_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TICK_BUCKETS = (0, 1, 2, 4, 8)
RATE_WINDOW_S = 10.0


@dataclass(frozen=True, order=True)
class RequestOutcome:
    """How one completion request ended: outcome "completed" (200 with its result, streamed to the end or
    not), "cancelled" (the client went away first), "refused" (a 4xx) or "failed" (a 5xx, also as a
    stream's error event); reason: the error code ("" when completed)."""

    route: str
    outcome: str
    status: int
    reason: str = ""

    @classmethod
    def of_error(cls, route: str, status: int, code: str | None) -> RequestOutcome:
        outcome = "cancelled" if status == CLIENT_CLOSED else "refused" if status < 500 else "failed"
        return cls(route, outcome, status, code or "")

    def labels(self) -> dict[str, str]:
        return {"route": self.route, "outcome": self.outcome, "status": str(self.status), "reason": self.reason}


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics: bucket le=b counts observations <= b)."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: dict[str, str]) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*self.buckets, "+Inf"), self.counts, strict=True):
            running += count
            out.append(f"{name}_bucket{_labels({**labels, 'le': _number(bound)})} {running}")
        out.append(f"{name}_sum{_labels(labels)} {_number(self.sum)}")
        out.append(f"{name}_count{_labels(labels)} {self.count}")
        return out


class TokenRate:
    """Tokens per second over the last RATE_WINDOW_S, from samples of a running total."""

    def __init__(self, window_s: float = RATE_WINDOW_S):
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, now: float, total: int) -> None:
        self.total = total
        self.samples.append((now, total))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()

    def per_second(self, now: float) -> float:
        """Tokens since the newest sample at least a window old (else the oldest one), per second."""
        if not self.samples:
            return 0.0
        base_time, base_total = self.samples[0]
        for sample_time, sample_total in self.samples:
            if sample_time > now - self.window_s:
                break
            base_time, base_total = sample_time, sample_total
        span = now - base_time
        return (self.total - base_total) / span if span > 0 else 0.0


class ServerMetrics:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.lock = threading.Lock()
        self.latency: dict[str, Histogram] = {}  # per preset: HTTP request received -> answered
        self.queue_time: dict[str, Histogram] = {}  # per preset: submitted -> admitted by the runtime
        self.verifier_batch_items = Histogram(BATCH_ITEM_BUCKETS)
        self.verifier_batch_tokens = Histogram(BATCH_TOKEN_BUCKETS)
        self.cancel_delay_ticks = Histogram(TICK_BUCKETS)
        self.responses: dict[tuple[str, int], int] = {}
        self.outcomes: dict[RequestOutcome, int] = {}  # completion requests by how they ended
        self.cancelled: dict[str, int] = {}
        self.searches: dict[tuple[str, str], int] = {}  # (preset, outcome) -> count
        self.tokens = {"prompt": 0, "output": 0, "returned": 0, "generated": 0, "wasted": 0}
        self.generated_rate = TokenRate()
        self.output_rate = TokenRate()

    # ---- writers --------------------------------------------------------------------------------
    def response(self, route: str, status: int) -> None:
        with self.lock:
            key = (route, status)
            self.responses[key] = self.responses.get(key, 0) + 1

    def request_outcome(self, outcome: RequestOutcome) -> None:
        with self.lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def request_latency(self, preset: str, seconds: float) -> None:
        with self.lock:
            self.latency.setdefault(preset, Histogram(LATENCY_BUCKETS_S)).observe(seconds)

    def returned_tokens(self, count: int) -> None:
        with self.lock:
            self.tokens["returned"] += count

    def search_finished(self, preset: str, result) -> None:
        """A SearchResult left the runtime (answered, cancelled or failed)."""
        outcome = "ok" if result.error is None else result.error
        with self.lock:
            self.searches[(preset, outcome)] = self.searches.get((preset, outcome), 0) + 1
            self.queue_time.setdefault(preset, Histogram(LATENCY_BUCKETS_S)).observe(result.timings.queued_s)
            usage = result.usage
            self.tokens["prompt"] += usage.prompt_tokens
            self.tokens["output"] += usage.output_tokens
            self.tokens["wasted"] += usage.wasted_tokens
            self.output_rate.add(self.clock(), self.tokens["output"])

    def generated_total(self, total: int) -> None:
        """Every token the generator sampled so far (engine thread, once per tick)."""
        with self.lock:
            self.tokens["generated"] = total
            self.generated_rate.add(self.clock(), total)

    def verifier_batch(self, items: int, tokens: int) -> None:
        with self.lock:
            self.verifier_batch_items.observe(items)
            self.verifier_batch_tokens.observe(tokens)

    def cancellation(self, reason: str, ticks_waited: int) -> None:
        """A search was cancelled `ticks_waited` engine ticks after its cancel was requested."""
        with self.lock:
            self.cancelled[reason] = self.cancelled.get(reason, 0) + 1
            self.cancel_delay_ticks.observe(ticks_waited)

    # ---- rendering --------------------------------------------------------------------------------
    def render(self, snapshot) -> str:
        now = self.clock()
        with self.lock:
            out: list[str] = []
            gauge = _writer(out, "gauge")
            counter = _writer(out, "counter")
            gauge("specscale_requests_running", "Searches admitted to the runtime", [({}, snapshot.running)])
            gauge("specscale_requests_waiting", "Searches accepted and waiting for admission",
                  [({}, snapshot.waiting)])
            gauge("specscale_kv_blocks_used", "Generator KV blocks held by live sequences",
                  [({}, snapshot.kv_blocks_used)])
            gauge("specscale_kv_blocks_total", "Generator KV blocks in the pool", [({}, snapshot.kv_blocks_total)])
            gauge("specscale_prm_kv_blocks_used", "PRM KV blocks held (cached step prefixes)",
                  [({}, snapshot.prm_kv_blocks_used)])
            gauge("specscale_live_sequences", "Generator engine sequences alive", [({}, snapshot.live_sequences)])
            gauge("specscale_engine_healthy", "1 while the engine thread serves", [({}, int(snapshot.failure is None))])
            gauge("specscale_generated_tokens_per_second", f"Generator tokens/s over the last {RATE_WINDOW_S:g} s",
                  [({}, self.generated_rate.per_second(now))])
            gauge("specscale_output_tokens_per_second", f"Completed-path tokens/s over the last {RATE_WINDOW_S:g} s",
                  [({}, self.output_rate.per_second(now))])
            counter("specscale_engine_ticks_total", "Runtime ticks (one generator iteration or PRM batch)",
                    [({}, snapshot.ticks)])
            counter("specscale_tokens_total", "Tokens by kind: prompt, output (all completed paths), returned "
                    "(paths sent to clients), generated (sampled), wasted (cancelled speculation)",
                    [({"kind": kind}, value) for kind, value in self.tokens.items()])
            counter("specscale_searches_total", "Searches that left the runtime, by preset and outcome",
                    [({"preset": p, "outcome": o}, v) for (p, o), v in sorted(self.searches.items())])
            counter("specscale_requests_cancelled_total", "Searches cancelled, by reason",
                    [({"reason": r}, v) for r, v in sorted(self.cancelled.items())])
            counter("specscale_http_responses_total", "HTTP responses by route and status",
                    [({"route": r, "status": str(s)}, v) for (r, s), v in sorted(self.responses.items())])
            counter("specscale_requests_total", "Completion requests by how they ended: completed, cancelled "
                    "(the client went away), refused (4xx) or failed (5xx), with the status and the error code",
                    [(o.labels(), v) for o, v in sorted(self.outcomes.items())])
            _histograms(out, "specscale_request_latency_seconds", "End-to-end latency of answered searches",
                        [({"preset": p}, h) for p, h in sorted(self.latency.items())])
            _histograms(out, "specscale_queue_time_seconds", "Time from submission to admission",
                        [({"preset": p}, h) for p, h in sorted(self.queue_time.items())])
            _histograms(out, "specscale_verifier_batch_size", "Paths per PRM batch", [({}, self.verifier_batch_items)])
            _histograms(out, "specscale_verifier_batch_tokens", "PRM input tokens per batch",
                        [({}, self.verifier_batch_tokens)])
            _histograms(out, "specscale_cancel_delay_ticks", "Engine ticks between a cancel request and the "
                        "search's KV being freed", [({}, self.cancel_delay_ticks)])
            return "\n".join(out) + "\n"


def _writer(out: list[str], kind: str):
    def write(name: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples)
    return write


def _histograms(out: list[str], name: str, help_text: str, series: list[tuple[dict, Histogram]]) -> None:
    out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} histogram")
    for labels, histogram in series:
        out.extend(histogram.lines(name, labels))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return repr(value) if isinstance(value, float) else str(value)
