"""The FastAPI application: OpenAI-compatible routes in front of the engine loop.

`POST /v1/chat/completions` and `POST /v1/completions` read the body (413 over the size limit, 400 on
malformed JSON), validate it (400 naming the field), prepare the search (tokenization off the event
loop), submit it (429 + Retry-After when the waiting queue is full) and then either await its outcome
or stream its events as Server-Sent Events. `GET /v1/models`, `/health` (with resident memory) and `/metrics` report. With an
API key, the /v1 routes need `Authorization: Bearer <key>` (401 otherwise).
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import replace

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from specscale.search.presets import PRESETS
from specscale.server.engine_loop import EngineLoop, Outcome, Refusal, RoundProgress
from specscale.server.errors import APIError, install_error_handlers
from specscale.server.metrics import ServerMetrics
from specscale.server.protocol import ChatCompletionRequest, CompletionRequest
from specscale.server.responses import DONE, CompletionFormat, ranked_paths, sse
from specscale.server.search_builder import PreparedSearch, SearchBuilder
from specscale.server.session import Interrupted, SearchSession
from specscale.server.settings import ServerSettings

CLIENT_CLOSED = 499  # nginx's status for a client that went away; never reaches that client
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


def build_app(engine_loop: EngineLoop, builder: SearchBuilder, metrics: ServerMetrics,
              settings: ServerSettings, on_shutdown=None) -> FastAPI:
    """An app serving through `engine_loop` (started and stopped with the app's lifespan)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine_loop.start()
        yield
        await run_in_threadpool(engine_loop.stop)
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="SpecScale", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.add_middleware(StatusCounter, metrics=metrics)
    started = int(time.time())

    def require_api_key(request: Request) -> None:
        if settings.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
            raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    api = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
    searches = SearchRoutes(engine_loop, builder, metrics, settings)

    @api.post("/chat/completions")
    async def chat_completions(request: Request):
        return await searches.serve(request, ChatCompletionRequest, builder.chat, CompletionFormat(chat=True))

    @api.post("/completions")
    async def completions(request: Request):
        return await searches.serve(request, CompletionRequest, builder.completion, CompletionFormat(chat=False))

    @api.get("/models")
    async def models():
        card = {"id": settings.served_model_name, "object": "model", "created": started, "owned_by": "specscale",
                "presets": sorted(PRESETS), "default_preset": settings.default_preset,
                "max_beam_size": settings.max_beam_size, "max_model_len": builder.context_tokens}
        return {"object": "list", "data": [card]}

    app.include_router(api)

    @app.get("/health")
    async def health():
        snapshot = engine_loop.snapshot
        body = {"status": "ok" if snapshot.failure is None else "failed", "error": snapshot.failure,
                "requests_running": snapshot.running, "requests_waiting": engine_loop.waiting(),
                "kv_blocks_used": snapshot.kv_blocks_used, "kv_blocks_total": snapshot.kv_blocks_total,
                "prm_kv_blocks_used": snapshot.prm_kv_blocks_used, "live_sequences": snapshot.live_sequences,
                "ticks": snapshot.ticks, "memory": engine_loop.memory()}
        return JSONResponse(body, status_code=200 if snapshot.failure is None else 503)

    @app.get("/metrics")
    async def prometheus():
        snapshot = replace(engine_loop.snapshot, waiting=engine_loop.waiting())
        return PlainTextResponse(metrics.render(snapshot),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


class SearchRoutes:
    """What the two completion endpoints share: body → search → response or stream."""

    def __init__(self, engine_loop: EngineLoop, builder: SearchBuilder, metrics: ServerMetrics,
                 settings: ServerSettings):
        self.engine_loop = engine_loop
        self.builder = builder
        self.metrics = metrics
        self.settings = settings

    async def serve(self, request: Request, model: type[BaseModel], prepare, output: CompletionFormat):
        started = time.monotonic()
        body = validate(model, await read_json(request, self.settings.max_body_bytes))
        early = self.engine_loop.refusal()  # before spending a tokenization on a request that cannot wait
        if early is not None:
            raise refused(early)
        prepared: PreparedSearch = await run_in_threadpool(prepare, body, uuid.uuid4().hex)
        handle = self.engine_loop.submit(prepared.request, prepared.preset, wants_progress=prepared.stream)
        if isinstance(handle, Refusal):
            raise refused(handle)
        session = SearchSession(self.engine_loop, handle, request.receive, prepared.timeout_s)
        if prepared.stream:
            events = self._stream(session, prepared, output, started)
            return SessionStreamingResponse(session, events)
        try:
            last = await session.outcome()
        finally:
            session.close()
        problem = outcome_problem(last, session.timeout_s)
        if problem is not None:
            raise problem
        self._record(prepared, last, started)
        return JSONResponse(output.response(prepared, last.result))

    async def _stream(self, session: SearchSession, prepared: PreparedSearch, output: CompletionFormat,
                      started: float):
        yield output.opening_chunk(prepared)
        async for event in session.events():
            if isinstance(event, RoundProgress):
                yield output.progress_chunk(prepared, event)
                continue
            problem = outcome_problem(event, session.timeout_s)
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


class SessionStreamingResponse(StreamingResponse):
    """An SSE response that closes its search session however the response ends (sent, failed, or
    abandoned by a client that went away), so an unfinished search is always cancelled."""

    def __init__(self, session: SearchSession, events):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.session = session

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.session.close()


class StatusCounter:
    """ASGI middleware counting responses by route and status (a pure ASGI wrapper: it leaves the
    request's receive channel, and so disconnect detection, untouched)."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.response(route, message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


# ---- request bodies --------------------------------------------------------------------------------
async def read_json(request: Request, limit: int):
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body is {declared} bytes; the limit is {limit} bytes", code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body exceeds the limit of {limit} bytes", code="body_too_large")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks), parse_constant=_reject_constant)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, NaN / Infinity
        raise APIError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from error


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def validate(model: type[BaseModel], payload) -> BaseModel:
    if not isinstance(payload, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(payload).__name__}",
                       code="invalid_json")
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        param = field_path(first["loc"])
        raise APIError(400, f"{param}: {first['msg']}", param, first["type"]) from error


def field_path(loc: tuple) -> str:
    """('messages', 0, 'content', 'str') → 'messages[0].content' (union member tags dropped)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in _TYPE_TAGS:
            path += f".{part}" if path else part
    return path


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def refused(refusal: Refusal) -> APIError:
    headers = {"Retry-After": str(refusal.retry_after_s)} if refusal.retry_after_s is not None else {}
    code = "queue_full" if refusal.status == 429 else "engine_unavailable"
    return APIError(refusal.status, refusal.message, code=code, headers=headers)


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

