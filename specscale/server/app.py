"""The FastAPI application: OpenAI-compatible routes in front of the engine loop.

`POST /v1/chat/completions` and `POST /v1/completions` read the body (413 over the size limit, 400 on
malformed JSON), validate it (400 naming the field), prepare the search (tokenization off the event
loop), submit it (429 + Retry-After when the waiting queue is full) and then either await its outcome
or stream its events as Server-Sent Events. `GET /v1/models`, `/health` (also HEAD; with resident memory) and `/metrics`
report.
With an API key, every path under /v1 needs `Authorization: Bearer <key>` (401 before routing; /health
and /metrics too with `protect_metrics`). No redirects: a path with a trailing slash is 404.
`build_app` is the one way to make the app (`specscale serve` runs it under uvicorn).
"""

from __future__ import annotations

import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from specscale.search.presets import PRESETS
from specscale.server.engine_loop import EngineLoop, Outcome, Refusal, RequestHandle, RoundProgress
from specscale.server.errors import CLIENT_CLOSED, APIError, install_error_handlers
from specscale.server.memory_trim import MemoryTrimmer
from specscale.server.metrics import RequestOutcome, ServerMetrics
from specscale.server.middleware import ApiKeyGuard, ErrorGuard, StatusCounter
from specscale.server.protocol import ChatCompletionRequest, CompletionRequest
from specscale.server.request_body import read_json, validate
from specscale.server.responses import DONE, CompletionFormat, ranked_paths, sse
from specscale.server.search_builder import PreparedSearch, SearchBuilder
from specscale.server.session import Interrupted, SearchSession
from specscale.server.settings import ServerSettings


def build_app(engine_loop: EngineLoop, builder: SearchBuilder, metrics: ServerMetrics,
              settings: ServerSettings, on_shutdown=None) -> FastAPI:
    """An app serving through `engine_loop` (started and stopped with the app's lifespan, as is the periodic
    malloc_trim of server/memory_trim.py)."""
    trimmer = MemoryTrimmer()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine_loop.start()
        trimmer.start()
        yield
        trimmer.stop()
        await run_in_threadpool(engine_loop.stop)
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="SpecScale", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    install_error_handlers(app)
    install_middleware(app, metrics, settings)
    app.state.settings = settings  # what `specscale serve` configures uvicorn's connection limits from
    app.state.metrics = metrics  # where the connection layer counts the responses it answers itself
    app.state.engine_loop = engine_loop  # what `specscale serve` drains on SIGTERM
    app.state.memory_trimmer = trimmer
    started = int(time.time())

    api = APIRouter(prefix="/v1")
    searches = SearchRoutes(engine_loop, builder, metrics, settings)

    @api.post("/chat/completions")
    async def chat_completions(request: Request):
        return await searches.serve(request, ChatCompletionRequest, builder.chat, CompletionFormat(chat=True))

    @api.post("/completions")
    async def completions(request: Request):
        return await searches.serve(request, CompletionRequest, builder.completion, CompletionFormat(chat=False))

    @api.get("/models")
    async def models():
        return {"object": "list", "data": [model_card(settings, builder.context_tokens, started)]}

    app.include_router(api)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        body = health_report(engine_loop)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics_text(engine_loop, metrics), media_type=PROMETHEUS_TEXT)

    return app


# ---- what /v1/models, /health and /metrics report (shared with the Ray ingress, docs/scale-out.md) -----
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def model_card(settings: ServerSettings, context_tokens: int, created: int) -> dict:
    return {"id": settings.served_model_name, "object": "model", "created": created, "owned_by": "specscale",
            "presets": sorted(PRESETS), "default_preset": settings.default_preset,
            "max_beam_size": settings.max_beam_size, "max_model_len": context_tokens}


def health_report(engine_loop: EngineLoop) -> dict:
    """status: "ok", "draining" (shutting down: finishing its searches, refusing new ones) or "failed"."""
    snapshot = engine_loop.snapshot
    status = "failed" if snapshot.failure is not None else "draining" if engine_loop.draining else "ok"
    return {"status": status, "error": snapshot.failure,
            "requests_running": snapshot.running, "requests_waiting": engine_loop.waiting(),
            "kv_blocks_used": snapshot.kv_blocks_used, "kv_blocks_total": snapshot.kv_blocks_total,
            "prm_kv_blocks_used": snapshot.prm_kv_blocks_used, "live_sequences": snapshot.live_sequences,
            "ticks": snapshot.ticks, "memory": engine_loop.memory(), "kernels": engine_loop.kernels}


def metrics_text(engine_loop: EngineLoop, metrics: ServerMetrics) -> str:
    return metrics.render(replace(engine_loop.snapshot, waiting=engine_loop.waiting()))


def install_middleware(app: FastAPI, metrics: ServerMetrics, settings: ServerSettings) -> None:
    """Outermost first: the status counter, the API key check, the unexpected-error guard (see
    server/middleware.py); the last one added wraps the others."""
    app.add_middleware(ErrorGuard)
    if settings.api_key is not None:
        extra = ("/health", "/metrics") if settings.protect_metrics else ()
        app.add_middleware(ApiKeyGuard, api_key=settings.api_key, extra_paths=extra)
    app.add_middleware(StatusCounter, metrics=metrics)


class SearchRoutes:
    """What the two completion endpoints share: body → search → response or stream."""

    def __init__(self, engine_loop: EngineLoop, builder: SearchBuilder, metrics: ServerMetrics,
                 settings: ServerSettings):
        self.engine_loop = engine_loop
        self.builder = builder
        self.metrics = metrics
        self.settings = settings

    async def serve(self, request: Request, model: type[BaseModel], prepare, output: CompletionFormat):
        """The response, with the request's outcome counted once it is known (`RequestOutcome`)."""
        route = request.url.path
        try:
            return await self._serve(request, model, prepare, output, route)
        except APIError as error:
            self.metrics.request_outcome(RequestOutcome.of_error(route, error.status, error.code))
            raise
        except Exception:  # ErrorGuard answers it with a 500
            self.metrics.request_outcome(RequestOutcome(route, "failed", 500, "internal_error"))
            raise

    async def _serve(self, request: Request, model: type[BaseModel], prepare, output: CompletionFormat, route: str):
        started = time.monotonic()
        body = validate(model, await read_json(request, self.settings.max_body_bytes))
        prepared, handle = await self.submit(body, prepare, uuid.uuid4().hex)
        session = SearchSession(self.engine_loop, handle, request.receive, prepared.timeout_s)
        if prepared.stream:
            ending = StreamEnding(route)
            events = self.stream(session, prepared, output, started, ending)
            return SessionStreamingResponse(session, events, ending, self.metrics)
        answer = await self.answer(session, prepared, output, started)
        self.metrics.request_outcome(RequestOutcome(route, "completed", 200))
        return JSONResponse(answer)

    async def submit(self, body: BaseModel, prepare, request_id: str) -> tuple[PreparedSearch, RequestHandle]:
        """A validated body → its search on the engine thread, or an APIError (4xx, 429, 503)."""
        early = self.engine_loop.refusal()  # before spending a tokenization on a request that cannot wait
        if early is not None:
            raise refused(early)
        prepared: PreparedSearch = await run_in_threadpool(prepare, body, request_id)
        handle = self.engine_loop.submit(prepared.request, prepared.preset, wants_progress=prepared.stream)
        if isinstance(handle, Refusal):
            raise refused(handle)
        return prepared, handle

    async def answer(self, session: SearchSession, prepared: PreparedSearch, output: CompletionFormat,
                     started: float) -> dict:
        """The whole (non-streamed) response body once the search is over, or an APIError (504, 503)."""
        try:
            last = await session.outcome()
        finally:
            session.close()
        problem = outcome_problem(last, session.timeout_s)
        if problem is not None:
            raise problem
        self._record(prepared, last, started)
        return output.response(prepared, last.result)

    async def stream(self, session: SearchSession, prepared: PreparedSearch, output: CompletionFormat,
                     started: float, ending: StreamEnding | None = None):
        """The SSE chunks; `ending` learns how the search ended (an error event, or its result). A search that
        ends after its client closed the connection counts as cancelled, whatever it had sent before."""
        yield output.opening_chunk(prepared)
        async for event in session.events():
            if isinstance(event, RoundProgress):
                yield output.progress_chunk(prepared, event)
                continue
            if isinstance(event, Outcome) and await session.client_gone():  # its answer would go nowhere
                event = Interrupted("disconnect")
            problem = outcome_problem(event, session.timeout_s)
            if ending is not None:
                ending.settle(problem)
            if problem is not None:
                yield sse(problem.body())
            else:
                self._record(prepared, event, started)
                for chunk in output.final_chunks(prepared, event.result):
                    yield chunk
        yield DONE

    def _record(self, prepared: PreparedSearch, outcome: Outcome, started: float) -> None:
        paths = ranked_paths(outcome.result, prepared.answer_selection)[:prepared.n]
        self.metrics.request_latency(prepared.preset, time.monotonic() - started)
        self.metrics.returned_tokens(sum(p.num_tokens for p in paths))


class StreamEnding:
    """How a stream's search ended, once it has: its result (completed) or an error event (a 504 or 503
    inside the stream). A stream that ends before either (its client went away) was cancelled."""

    def __init__(self, route: str):
        self.route = route
        self.outcome: RequestOutcome | None = None

    def settle(self, problem: APIError | None) -> None:
        if problem is None:
            self.outcome = RequestOutcome(self.route, "completed", 200)
        else:
            self.outcome = RequestOutcome.of_error(self.route, problem.status, problem.code)

    def final(self) -> RequestOutcome:
        return self.outcome or RequestOutcome(self.route, "cancelled", CLIENT_CLOSED, "client_closed")


class SessionStreamingResponse(StreamingResponse):
    """An SSE response that closes its search session however the response ends (sent, failed, or
    abandoned by a client that went away), so an unfinished search is always cancelled, and counts how
    the request ended."""

    def __init__(self, session: SearchSession, events, ending: StreamEnding, metrics: ServerMetrics):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.session = session
        self.ending = ending
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.session.close()
            self.metrics.request_outcome(self.ending.final())


def refused(refusal: Refusal) -> APIError:
    headers = {"Retry-After": str(refusal.retry_after_s)} if refusal.retry_after_s is not None else {}
    return APIError(refusal.status, refusal.message, code=refusal.code, headers=headers)


def outcome_problem(event: Outcome | Interrupted, timeout_s: float) -> APIError | None:
    """The error to answer with when the search did not produce a result."""
    if isinstance(event, Interrupted):
        if event.reason == "timeout":
            return APIError(504, f"the search ran past its time budget of {timeout_s:g} s and was cancelled",
                            code="timeout")
        return APIError(CLIENT_CLOSED, "the client closed the request; the search was cancelled",
                        code="client_closed")
    if event.failure is not None:
        return APIError(503, f"the engine failed: {event.failure}", code="engine_failed")
    if event.result.error is not None:
        return APIError(503, f"the search was stopped: {event.result.error} (the server is shutting down)",
                        code="search_stopped")
    return None

