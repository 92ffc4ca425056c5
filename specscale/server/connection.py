"""GuardedH11Protocol: uvicorn's h11 HTTP protocol with read timeouts and a cap on open connections.

uvicorn times out an idle keep-alive connection, but not one that is slow to send its request: a
client that opens a connection and sends nothing, or half a header, or a few bytes of its body now and
then ("slow loris"), would hold its connection (and its file descriptor) for as long as it liked. Here:

- the headers of a request must be complete within `header_timeout_s` of the connection opening or of
  the request's first byte (a kept-alive connection between requests stays under uvicorn's own
  keep-alive timeout);
- its body must be complete within `body_timeout_s` of its headers;
- past either deadline the client gets 408 with OpenAI's error JSON (unless a response has started)
  and the connection is closed; a handler still reading that body sees a disconnect;
- a connection opened while `max_connections` are open gets 503 with OpenAI's error JSON and is closed.

Used by `specscale serve` through `uvicorn_config` (see docs/architecture.md, "Serving over HTTP").
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from specscale.server.errors import error_body
from specscale.server.metrics import ServerMetrics
from specscale.server.settings import ServerSettings

log = logging.getLogger("specscale.server")


class GuardedH11Protocol(H11Protocol):
    def __init__(self, *args, settings: ServerSettings, metrics: ServerMetrics, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = settings
        self.metrics = metrics  # counts the 408s and 503s answered here, under route "connection"
        self._header_deadline: asyncio.TimerHandle | None = None
        self._body_deadline: asyncio.TimerHandle | None = None

    # ---- the asyncio protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.settings.max_connections:
            log.debug("refused a connection: %d are open", len(self.connections) - 1)
            self._answer_and_close(503, f"the server has its limit of {self.settings.max_connections} open "
                                   "connections; retry later")
            return
        self._watch_reading()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel(header=True, body=True)
        super().connection_lost(exc)

    # ---- deadlines -----------------------------------------------------------------------------------
    def _watch_reading(self) -> None:
        """Arm or cancel the two deadlines after the client's side of the connection moved (or not). A
        connection waiting for a request is under uvicorn's keep-alive timeout when that is armed (idle
        after a response), else under the header deadline (new, or part of a request received)."""
        if self.transport.is_closing():
            self._cancel(header=True, body=True)
            return
        state = self.conn.their_state
        reading_headers = state is h11.IDLE and self.timeout_keep_alive_task is None
        if reading_headers and self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.settings.header_timeout_s, self._timed_out, "headers")
        if state is h11.SEND_BODY and self._body_deadline is None:
            self._body_deadline = self.loop.call_later(self.settings.body_timeout_s, self._timed_out, "body")
        self._cancel(header=not reading_headers, body=state is not h11.SEND_BODY)

    def _cancel(self, header: bool, body: bool) -> None:
        if header and self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None
        if body and self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None

    def _timed_out(self, part: str) -> None:
        self._header_deadline = self._body_deadline = None
        if self.transport.is_closing():
            return
        limit = self.settings.header_timeout_s if part == "headers" else self.settings.body_timeout_s
        log.debug("closing a connection that did not send its request %s within %g s", part, limit)
        cycle = self.cycle if part == "body" else None
        if cycle is not None and cycle.response_started:
            self.transport.close()
            return
        if cycle is not None:  # the handler reading this body sees a disconnect; its answer goes nowhere
            cycle.disconnected = True
            cycle.message_event.set()
        self._answer_and_close(408, f"the request's {part} did not arrive within {limit:g} s")

    def _answer_and_close(self, status: int, message: str) -> None:
        """Write a complete response outside h11's bookkeeping (the connection ends with it)."""
        self.metrics.response("connection", status)
        payload = json.dumps(error_body(status, message)).encode()
        reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                % (status, reason, len(payload)))
        self.transport.write(head + payload)
        self.transport.close()


def uvicorn_config(app, settings: ServerSettings, metrics: ServerMetrics, **options) -> uvicorn.Config:
    """A uvicorn config serving `app` over GuardedH11Protocol with these settings' limits and idle keep-alive
    timeout; the responses the protocol answers itself are counted in `metrics` like the app's."""
    protocol = functools.partial(GuardedH11Protocol, settings=settings, metrics=metrics)
    return uvicorn.Config(app, http=protocol, timeout_keep_alive=settings.keep_alive_s, **options)
