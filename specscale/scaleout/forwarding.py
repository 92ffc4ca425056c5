"""ForwardedSearch: one HTTP search request on the ingress, carried to a search replica by a Ray Serve
streaming handle call (the replica is picked by Serve's router; docs/scale-out.md).

A replica that dies under a request (its process killed, its node lost) surfaces here as a Ray actor
error, and a replica whose engine thread failed (e.g. its PRM replicas unreachable) answers 503
`engine_failed` / `engine_unavailable`. The request is then sent again from scratch, up to `RETRIES`
times, a little later each time (Serve's router may not know of the death yet), to whichever replica
Serve's router picks: a search restarted with the same seed is the same search, so a whole answer is
retried transparently and a retried stream skips the chunks its client already has. A stream that
already sent progress of an unseeded search cannot be replayed and ends with a 503 error event, as does
one past its retries. A full cluster (Serve's router queue over its bound) answers 429 + Retry-After; a
request that waits for its first answer past its time budget, 504.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from specscale.scaleout.cluster_counters import ClusterCounters
from specscale.scaleout.messages import Answered, Rejected, StreamOpened
from specscale.server.errors import APIError
from specscale.server.responses import DONE, sse

RETRIES = 3  # re-runs of one search after its replica failed
RETRY_DELAY_S = 0.25  # before the k-th re-run: k times this
RETRYABLE_CODES = ("engine_failed", "engine_unavailable")  # a replica's 503 when its engine thread failed
OPENING_CHUNKS = 1  # a stream's first chunk (the assistant role) is the same for any search of the request
FIRST_ANSWER_GRACE_S = 5.0  # the replica enforces the budget; the ingress waits this much longer
ERROR_EVENT = 'data: {"error": '  # how an error event inside a stream begins (server/responses.py `sse`)


@dataclass(frozen=True)
class ReplicaLost:
    """The replica serving the call went away (its actor died or became unreachable)."""

    reason: str


@dataclass(frozen=True)
class CallEnded:
    """The replica's generator finished."""


class ForwardedSearch:
    def __init__(self, replicas, body, chat: bool, request_id: str, timeout_s: float, retry_after_s: int,
                 counters: ClusterCounters):
        self.replicas = replicas.options(stream=True)
        self.body = body
        self.chat = chat
        self.request_id = request_id
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.counters = counters
        self.retries = 0  # re-runs so far
        self.call = None  # the replica's current DeploymentResponseGenerator
        self.stream_error: tuple[int, str | None] | None = None  # (status, code) of a stream's error event
        self.stream_finished = False  # the stream's last chunk was handed on

    # ---- the first message: the status of the HTTP answer ---------------------------------------------
    async def open(self) -> Rejected | Answered | StreamOpened:
        """Send the search; a replica lost before its first message means a re-run (`_may_retry`)."""
        deadline = self.timeout_s + FIRST_ANSWER_GRACE_S
        try:
            first = await asyncio.wait_for(self._first(), timeout=deadline)
        except TimeoutError:
            self.close()
            return Rejected.of(APIError(504, f"no replica answered within the time budget of "
                                        f"{self.timeout_s:g} s; the search was cancelled", code="timeout"))
        return first

    async def _first(self) -> Rejected | Answered | StreamOpened:
        while True:
            self.call = self.replicas.search.remote(self.body, self.chat, self.request_id)
            first = _lost_if_engine_failed(await self._next())
            if isinstance(first, ReplicaLost):
                if await self._may_retry(first, sent=0):
                    continue
                return self._lost(first)
            if isinstance(first, CallEnded):
                return self._lost(ReplicaLost("the replica ended the call without an answer"))
            return first

    # ---- the stream after StreamOpened ------------------------------------------------------------------
    async def chunks(self):
        """The SSE chunks; on a lost replica, the retried search's chunks past those already sent."""
        sent = skip = 0
        while True:
            item = await self._next()
            if isinstance(item, CallEnded):
                self.stream_finished = True
                return
            if isinstance(item, ReplicaLost):
                skip = await self._resume(item, sent)
                if skip is None:
                    lost = self._lost(item)
                    self.stream_error = (lost.status, lost.body["error"]["code"])
                    yield sse(lost.body)
                    self.stream_finished = True  # before [DONE]: its client may go away once it has read it
                    yield DONE
                    return
                continue
            if skip:
                skip -= 1
                continue
            sent += 1
            self.stream_error = self.stream_error or error_event(item)
            if item == DONE:  # the stream is whole once [DONE] is handed on: a client that has read it may go
                self.stream_finished = True  # away before the call's end arrives, and the proxy cancels us then
            yield item

    async def _resume(self, lost: ReplicaLost, sent: int) -> int | None:
        """Chunks to skip on the retried call, or None when it cannot be retried."""
        if not await self._may_retry(lost, sent):
            return None
        self.call = self.replicas.search.remote(self.body, self.chat, self.request_id)
        opened = await self._next()
        return sent if isinstance(opened, StreamOpened) else None

    # ---- helpers ---------------------------------------------------------------------------------------
    async def _may_retry(self, lost: ReplicaLost, sent: int) -> bool:
        """Whether to re-run the search (after a short wait) or give up on it."""
        self.counters.replica_lost()
        replayable = sent <= OPENING_CHUNKS or self.body.seed is not None
        if self.retries >= RETRIES or not replayable:
            self.counters.retry("not_retried")
            return False
        self.retries += 1
        self.counters.retry("retried")
        await asyncio.sleep(RETRY_DELAY_S * self.retries)
        return True

    async def _next(self):
        """The call's next message, or ReplicaLost / CallEnded / a 429 Rejected (values, not exceptions).
        A call that ended is forgotten: there is nothing left to cancel (and cancelling a call whose
        routing failed would raise its error again)."""
        try:
            return await self.call.__anext__()
        except StopAsyncIteration:
            ended = CallEnded()
        except BackPressureError:
            ended = Rejected.of(APIError(429, "every replica is at capacity; retry later", code="queue_full",
                                         headers={"Retry-After": str(self.retry_after_s)}))
        except (RayActorError, DeploymentUnavailableError) as error:
            ended = ReplicaLost(f"{type(error).__name__}")
        self.call = None
        return ended

    def _lost(self, lost: ReplicaLost) -> Rejected:
        """The 503 of a search that could not be re-run (again)."""
        return Rejected.of(APIError(503, f"the replica serving this search failed ({lost.reason}) and the "
                                    "search could not be retried; retry the request", code="replica_failed"))

    def close(self) -> None:
        """Cancel the replica's call (a no-op once it has finished): the search's KV is freed there."""
        if self.call is not None:
            self.call.cancel()


def error_event(chunk) -> tuple[int, str | None] | None:
    """(status, code) of a replica's error event inside a stream (504 past the time budget, 503 otherwise,
    as server/app.py `outcome_problem` answers), None for any other chunk."""
    if not (isinstance(chunk, str) and chunk.startswith(ERROR_EVENT)):
        return None
    error = json.loads(chunk.removeprefix("data: "))["error"]
    return 504 if error["type"] == "timeout_error" else 503, error["code"]


def _lost_if_engine_failed(first):
    """A replica's 503 because its engine thread failed counts as that replica lost (its health check
    has Serve replace it); any other first message stands."""
    if isinstance(first, Rejected) and first.status == 503 and first.body["error"]["code"] in RETRYABLE_CODES:
        return ReplicaLost(f"its engine failed: {first.body['error']['message']}")
    return first
