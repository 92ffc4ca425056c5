"""Ingress: the one HTTP front of `specscale serve --ray`, a Ray Serve ingress deployment serving the same
OpenAI API as `specscale serve` (server/app.py) in front of the search replicas (docs/scale-out.md).

Completions: the body is read, validated and authenticated here (the same functions as the single-process
server); the search goes to a replica through a Ray Serve streaming handle call, routed by Serve's router
(`ForwardedSearch`). `/v1/models`, `/health` and `/metrics` ask every replica at once (Serve's handle
`broadcast`, which a full cluster does not refuse): `/health` lists each replica and the totals,
`/metrics` sums the replicas' series with the ingress's own HTTP counts, its replica-failure counters and
its count of every completion request by how it ended (`specscale_requests_total`: the ingress sees each
request's end as its client does, across re-runs on another replica; the replicas count none).
In disaggregated serving both also ask every PRM replica (`VerifierReplica`): /health lists them apart
and adds their PRM KV to the total, /metrics sums their PRM-batch series with the rest.
Until every deployment has had all its replicas running at once, /health answers 503 "starting" with what
the layout waits for (`layout_start.py`); after that, a replica short is one lost: "degraded" (200) while
some serve, "failed" (503) when none does.

Drain (`drain`, called by `specscale serve --ray` on SIGTERM): new completions get 503 + Retry-After and
/health answers 503 "draining" while the requests the ingress holds run to their end; then it reports what
the replicas still hold (docs/scale-out.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from ray import serve
from ray.exceptions import TaskCancelledError
from ray.serve.exceptions import DeploymentUnavailableError

from specscale.scaleout.cluster_counters import ClusterCounters
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.exposition import only_families, sum_expositions
from specscale.scaleout.forwarding import ForwardedSearch
from specscale.scaleout.layout_start import (
    DeploymentCount,
    LayoutStart,
    cluster_resources,
    layout_deployments,
    waiting_for,
)
from specscale.scaleout.messages import Rejected, StreamOpened
from specscale.server.app import PROMETHEUS_TEXT, install_middleware
from specscale.server.engine_loop import EngineSnapshot
from specscale.server.errors import CLIENT_CLOSED, APIError, install_error_handlers
from specscale.server.metrics import RequestOutcome, ServerMetrics
from specscale.server.protocol import ChatCompletionRequest, CompletionRequest
from specscale.server.request_body import read_json, validate

REPLICA_HEADER = "X-SpecScale-Replica"  # which replica answered (the first one, for a retried stream)
RETRIES_HEADER = "X-SpecScale-Retries"  # re-runs after a replica failed, before the answer (or the stream) began
log = logging.getLogger("specscale.server")
POLL_TIMEOUT_S = 5.0  # a replica that does not answer a /health or /metrics poll within this is left out
HEALTH_TOTALS = ("requests_running", "requests_waiting", "kv_blocks_used", "kv_blocks_total", "prm_kv_blocks_used",
                 "live_sequences", "ticks")
SERVING_STATES = ("ok", "degraded")  # /health answers 200; "starting", "draining", "failed" 503


@serve.ingress()
class Ingress:
    def __init__(self, config: ScaleOutConfig, replicas, verifiers=None):
        self.config = config
        self.replicas = replicas  # DeploymentHandle of the SearchReplica deployment
        self.verifiers = verifiers  # DeploymentHandle of the VerifierReplica deployment (disaggregated serving)
        self.metrics = ServerMetrics()  # only its HTTP status and request outcome counts: the rest from replicas
        self.counters = ClusterCounters()
        self.started = int(time.time())
        self._model_card: dict | None = None
        self.draining = False
        self.open_requests = 0  # completions received and not yet answered to the end (streams included)
        self.layout_start = LayoutStart()  # /health says "starting" until every deployment was up at once
        self.last_waiting: list[str] = []  # what the last "starting" answer waited for (logged on change)

    async def drain(self, timeout_s: float) -> DrainReport:
        """Refuse new completions, wait up to `timeout_s` for the open ones, report what the replicas hold."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.open_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return DrainReport(self.open_requests, _described(await self._poll()), _described(await self._poll_verifiers()))

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_ingress_app(self)

    # ---- completions ---------------------------------------------------------------------------------
    async def complete(self, request: Request, model, chat: bool):
        """The response; the request's outcome is counted once known (a stream's when it ends), as the
        single-process server counts it (server/app.py `SearchRoutes.serve`)."""
        route = request.url.path
        try:
            return await self._counted_complete(request, model, chat, route)
        except APIError as error:
            self.metrics.request_outcome(RequestOutcome.of_error(route, error.status, error.code))
            raise
        except asyncio.CancelledError:  # the client went away before its answer
            self.metrics.request_outcome(RequestOutcome(route, "cancelled", CLIENT_CLOSED, "client_closed"))
            raise
        except Exception:  # ErrorGuard answers it with a 500
            self.metrics.request_outcome(RequestOutcome(route, "failed", 500, "internal_error"))
            raise

    async def _counted_complete(self, request: Request, model, chat: bool, route: str):
        if self.draining:
            raise APIError(503, "the server is shutting down and finishing the searches it has; retry on another "
                           "server", code="draining", headers={"Retry-After": str(self.config.settings.retry_after_s)})
        self.open_requests += 1
        handed_over = False
        try:
            response = await self._complete(request, model, chat, route)
            handed_over = isinstance(response, ForwardedStreamingResponse)
            return response
        finally:
            if not handed_over:  # a stream counts until its last chunk is sent (ForwardedStreamingResponse)
                self.open_requests -= 1

    async def _complete(self, request: Request, model, chat: bool, route: str):
        settings = self.config.settings
        body = validate(model, await read_json(request, settings.max_body_bytes))
        timeout_s = min(body.search.timeout_s or settings.request_timeout_s, settings.request_timeout_s)
        search = ForwardedSearch(self.replicas, body, chat, uuid.uuid4().hex, timeout_s, settings.retry_after_s,
                                 self.counters)
        try:
            first = await search.open()
        except BaseException:  # the client went away (cancelled) or the ingress failed: free the replica's search
            search.close()
            raise
        if isinstance(first, StreamOpened):
            return ForwardedStreamingResponse(search, first.replica_id, self, route)
        search.close()
        if isinstance(first, Rejected):
            self.metrics.request_outcome(RequestOutcome.of_error(route, first.status, first.body["error"]["code"]))
            return first.response()
        self.metrics.request_outcome(RequestOutcome(route, "completed", 200))
        return JSONResponse(first.body, headers={REPLICA_HEADER: first.replica_id, RETRIES_HEADER: str(search.retries)})

    # ---- reports -------------------------------------------------------------------------------------
    async def model_list(self) -> dict:
        """Every replica serves the same model: the first card that comes back is kept."""
        if self._model_card is None:
            self._model_card = next(iter(await self._broadcast("model_card", self.started)), None)
        if self._model_card is None:
            raise APIError(503, "no replica answered; retry later", code="replica_failed")
        return {"object": "list", "data": [self._model_card]}

    async def health(self) -> JSONResponse:
        replicas = _described(await self._poll())
        verifiers = _described(await self._poll_verifiers())
        healthy = sum(1 for r in replicas if r["error"] is None)
        verifiers_healthy = len(verifiers)  # a PRM replica that answers serves (Serve replaces one that fails)
        total = {name: sum(r[name] for r in replicas) for name in HEALTH_TOTALS}
        total["prm_kv_blocks_used"] += sum(v["prm_kv_blocks_used"] for v in verifiers)
        complete = healthy >= self.config.replicas and verifiers_healthy >= self.config.verifier_replicas
        serving = healthy > 0 and (verifiers_healthy > 0 or not self.config.disaggregated)
        deployments = self._deployments(len(replicas), len(verifiers))
        starting = not self.layout_start.observe(deployments) and not self.draining
        state = ("draining" if self.draining else "starting" if starting else "ok" if complete
                 else "degraded" if serving else "failed")
        body = {"status": state, "replicas_target": self.config.replicas, "replicas_healthy": healthy,
                **total, "replicas": replicas}
        if self.config.disaggregated:
            body |= {"verifier_replicas_target": self.config.verifier_replicas,
                     "verifier_replicas_healthy": verifiers_healthy, "verifier_replicas": verifiers}
        if starting:
            body["waiting_for"] = await self._waiting_for(deployments)
        return JSONResponse(body, status_code=200 if state in SERVING_STATES else 503)

    def _deployments(self, replicas: int, verifiers: int) -> list[DeploymentCount]:
        """How many replicas of each deployment answered, of how many (the ingress is the one answering)."""
        return layout_deployments(self.config, {"SearchReplica": replicas, "VerifierReplica": verifiers})

    async def _waiting_for(self, deployments: list[DeploymentCount]) -> list[str]:
        """What a layout not yet whole waits for, logged when that changes."""
        waiting = waiting_for(deployments, *await cluster_resources())
        if waiting != self.last_waiting:
            log.info("the Ray layout is starting: %s", "; ".join(waiting))
            self.last_waiting = waiting
        return waiting

    async def prometheus(self) -> PlainTextResponse:
        statuses = await self._poll()
        verifiers = await self._poll_verifiers()
        http = only_families(self.metrics.render(EngineSnapshot()),
                             {"specscale_http_responses_total", "specscale_requests_total"})
        texts = [*(s.metrics for s in statuses), *(v.metrics for v in verifiers), http]
        cluster = self.counters.render(len(statuses), self.config.replicas)
        if self.config.disaggregated:
            cluster += self.counters.render_verifiers(len(verifiers), self.config.verifier_replicas)
        return PlainTextResponse(sum_expositions(texts) + cluster, media_type=PROMETHEUS_TEXT)

    async def _poll(self) -> list:
        """Every live replica's ReplicaStatus, by replica id."""
        statuses = await self._broadcast("status")
        self.counters.saw_replicas([s.replica_id for s in statuses])
        return sorted(statuses, key=lambda s: s.replica_id)

    async def _poll_verifiers(self) -> list:
        """Every live PRM replica's ReplicaStatus (none unless disaggregated)."""
        if self.verifiers is None:
            return []
        return sorted(await self._broadcast("status", deployment=self.verifiers), key=lambda s: s.replica_id)

    async def _broadcast(self, method: str, *args, deployment=None) -> list:
        """`method` on every replica of the deployment (default: the search replicas) at once; those that fail
        or do not answer within POLL_TIMEOUT_S are left out (all of them when the deployment has no replica up)."""
        handle = self.replicas if deployment is None else deployment
        try:
            results = await handle.broadcast(method, *args).results_async(timeout_s=POLL_TIMEOUT_S,
                                                                          return_exceptions=True)
        except (TimeoutError, DeploymentUnavailableError):
            return []
        return [r for r in results if not isinstance(r, BaseException)]


@dataclass(frozen=True)
class DrainReport:
    """What a drain left: requests still open at the ingress (past the drain's timeout), and every search
    and PRM replica's /health body."""

    open_requests: int
    replicas: list[dict]
    verifiers: list[dict]

    def describe(self) -> str:
        total = {name: sum(r[name] for r in self.replicas) for name in HEALTH_TOTALS}
        line = (f"{self.open_requests} requests open at the ingress; {len(self.replicas)} search replicas: "
                f"{total['requests_running']} running, {total['requests_waiting']} waiting, "
                f"{total['kv_blocks_used']} generator KV blocks in use, {total['live_sequences']} live sequences")
        if self.verifiers:
            cached = sum(v["prm_kv_blocks_used"] for v in self.verifiers)
            line += f"; {len(self.verifiers)} PRM replicas: {cached} PRM KV blocks hold cached step prefixes"
        return line


def _described(statuses: list) -> list[dict]:
    """Each replica's /health body with who it is."""
    return [dict(replica_id=s.replica_id, pid=s.pid, node_id=s.node_id, **s.health) for s in statuses]


class ForwardedStreamingResponse(StreamingResponse):
    """An SSE response from a replica's stream that cancels the replica's call however the response ends
    (sent, failed, or abandoned by a client that went away), and counts how the request ended: an error
    event's status and code, completed when its last chunk was sent, cancelled by its client otherwise."""

    def __init__(self, search: ForwardedSearch, replica_id: str, ingress: Ingress, route: str):
        super().__init__(search.chunks(), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                  REPLICA_HEADER: replica_id, RETRIES_HEADER: str(search.retries)})
        self.search = search
        self.ingress = ingress
        self.route = route

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except TaskCancelledError:  # how Ray Serve's receive channel says that the client went away
            log.debug("the client of a stream went away; its search is cancelled")
        finally:
            self.search.close()
            self.ingress.open_requests -= 1
            self.ingress.metrics.request_outcome(stream_outcome(self.search, self.route))


def stream_outcome(search: ForwardedSearch, route: str) -> RequestOutcome:
    if search.stream_error is not None:
        return RequestOutcome.of_error(route, *search.stream_error)
    if search.stream_finished:
        return RequestOutcome(route, "completed", 200)
    return RequestOutcome(route, "cancelled", CLIENT_CLOSED, "client_closed")


def build_ingress_app(ingress: Ingress) -> FastAPI:
    app = FastAPI(title="SpecScale on Ray Serve", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    install_error_handlers(app)
    install_middleware(app, ingress.metrics, ingress.config.settings)  # status counts, API key, error guard
    api = APIRouter(prefix="/v1")

    @api.post("/chat/completions")
    async def chat_completions(request: Request):
        return await ingress.complete(request, ChatCompletionRequest, chat=True)

    @api.post("/completions")
    async def completions(request: Request):
        return await ingress.complete(request, CompletionRequest, chat=False)

    @api.get("/models")
    async def models():
        return await ingress.model_list()

    app.include_router(api)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        return await ingress.health()

    @app.get("/metrics")
    async def prometheus():
        return await ingress.prometheus()

    return app
