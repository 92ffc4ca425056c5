"""The app's ASGI middleware, outermost first: `StatusCounter` (every response counted by route and
status), `ApiKeyGuard` (Bearer key on the protected paths, checked before routing) and `ErrorGuard` (an
unexpected exception becomes a 500 in OpenAI's error JSON on a connection that stays usable).

All three are pure ASGI wrappers: they leave the request's receive channel, and so disconnect detection,
untouched. `ErrorGuard` sits inside the counter, so a 500 is counted like any other status; it answers
the exception itself instead of re-raising, so neither Starlette nor uvicorn sees it (uvicorn would log a
second traceback and close a keep-alive connection without `Connection: close`).
"""

from __future__ import annotations

import hmac
import json
import logging

from specscale.server.errors import APIError, error_body
from specscale.server.metrics import ServerMetrics

log = logging.getLogger("specscale.server")

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


class StatusCounter:
    """Counts responses by route ("other" for an unknown path) and status."""

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


class ApiKeyGuard:
    """401 unless `Authorization: Bearer <api_key>`, on every path under /v1 (known or not, so a
    client without the key learns nothing about the routes) and on `extra_paths`."""

    def __init__(self, app, api_key: str, extra_paths: tuple[str, ...] = ()):
        self.app = app
        self.api_key = api_key.encode()
        self.extra_paths = extra_paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self._protects(scope["path"]) and not self._authorized(scope):
            error = APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                             code="invalid_api_key")
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _protects(self, path: str) -> bool:
        return path == "/v1" or path.startswith("/v1/") or path in self.extra_paths

    def _authorized(self, scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)


class ErrorGuard:
    """An exception out of the app: a 500 with OpenAI's error JSON if the response has not started
    (logged once, with its traceback); if it has, the response is left unfinished, which makes uvicorn
    close the connection (the client sees a truncated response, never a wrong one)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # the boundary: whatever a handler raised, the client gets an answer
            log.exception("unexpected error serving %s %s", scope["method"], scope["path"])
            if not started:
                await send_json(send, 500, error_body(500, f"internal error: {type(exc).__name__}"))


async def send_json(send, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
