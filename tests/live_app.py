"""The real app under real uvicorn in a thread, in front of the scripted search backend: starts in well under
a second, so the hardening and fuzz tests can hit HTTP edge cases (raw sockets, kept-alive connections,
slow clients) without loading models. The tokenizer and the PRM format are the real ones on a tiny
ChatML tokenizer, so tokenization happens as in `specscale serve`."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import h11
import uvicorn

from checkpoints import build_tokenizer
from search_backends import scripted_runtime
from specscale.server.app import build_app
from specscale.server.connection import uvicorn_config
from specscale.server.engine_loop import EngineLoop
from specscale.server.metrics import ServerMetrics
from specscale.server.search_builder import SearchBuilder
from specscale.server.settings import ServerSettings
from specscale.tokenizer import Tokenizer
from specscale.verify.formats import QwenMathPRMFormat

API_KEY = "live-key"
MODEL = "tiny"


@dataclass
class LiveApp:
    host: str
    port: int
    metrics: ServerMetrics
    settings: ServerSettings
    server: uvicorn.Server

    def open_connections(self) -> int:
        """Connections uvicorn holds open now (its own count, read from the test's thread)."""
        return len(self.server.server_state.connections)

    def wait_for_connections(self, count: int, timeout_s: float = 30.0) -> None:
        """Until uvicorn holds exactly `count` connections (a hang guard, not a speed limit)."""
        deadline = time.monotonic() + timeout_s
        while self.open_connections() != count:
            assert time.monotonic() < deadline, f"{self.open_connections()} connections open, not {count}"
            time.sleep(0.005)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def connect(self) -> RawConnection:
        return RawConnection(self.host, self.port)


def live_builder(tokenizer_dir: Path, settings: ServerSettings, builder_class=SearchBuilder) -> SearchBuilder:
    if not (tokenizer_dir / "tokenizer.json").is_file():
        build_tokenizer(tokenizer_dir)
    tokenizer = Tokenizer(tokenizer_dir)
    prm_format = QwenMathPRMFormat(tokenizer)
    return builder_class(tokenizer, "You are a careful solver.", 512, prm_format, 512, settings)


@contextmanager
def serve(builder: SearchBuilder, settings: ServerSettings) -> Iterator[LiveApp]:
    """The app on a free loopback port until the block ends (then uvicorn shuts down gracefully)."""
    metrics = ServerMetrics()
    engine_loop = EngineLoop(partial(scripted_runtime, 4), metrics, settings.max_waiting, settings.retry_after_s)
    app = build_app(engine_loop, builder, metrics, settings)
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn_config(app, settings, metrics, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield LiveApp("127.0.0.1", sock.getsockname()[1], metrics, settings, server)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


class RawConnection:
    """One kept-alive HTTP/1.1 connection driven with h11: a request on it fails loudly (h11's
    RemoteProtocolError, a reset, a timeout) if the server dropped it without saying `Connection: close`."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0):
        self.host = host
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.conn = h11.Connection(h11.CLIENT)

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Reply:
        fields = {"Host": self.host, "Content-Length": str(len(body)), **(headers or {})}
        self._send(h11.Request(method=method, target=path, headers=list(fields.items())))
        self._send(h11.Data(data=body))
        self._send(h11.EndOfMessage())
        reply = self._read_reply()
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return reply

    @property
    def reusable(self) -> bool:
        """Between two exchanges (not part-way through one that failed)."""
        return self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE

    def post_json(self, path: str, payload: bytes, key: str | None = API_KEY) -> Reply:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return self.request("POST", path, payload, headers)

    def _send(self, event) -> None:
        self.sock.sendall(self.conn.send(event))

    def _read_reply(self) -> Reply:
        status, headers, body = 0, {}, b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(self.sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return Reply(status, headers, body)

    def close(self) -> None:
        self.sock.close()
