"""The server against hostile input and clients (issue 16), over real uvicorn on loopback in front of the
scripted backend (tests/live_app.py): inputs that used to be 500s are 400s on a connection that stays
usable, every status is counted, aborted uploads log one debug line, slow clients are timed out, open
connections are capped, and the small contract points (no redirects, tool fields, HEAD /health,
protected metrics, an empty API key refused)."""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from argparse import Namespace
from dataclasses import replace

import httpx
import pytest

from live_app import API_KEY, MODEL, live_builder, serve
from specscale.serve import run_serve
from specscale.server.connection import uvicorn_config
from specscale.server.metrics import ServerMetrics
from specscale.server.search_builder import SearchBuilder
from specscale.server.settings import ServerSettings

SETTINGS = ServerSettings(served_model_name=MODEL, api_key=API_KEY, max_beam_size=8, request_timeout_s=5,
                          max_body_bytes=64 * 1024, header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=2.0,
                          max_connections=12)
FAST = {"beam_size": 4, "beam_width": 2, "max_rounds": 2}


def chat(content: str = "What is 2 + 3?", **fields) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "search": FAST}
    body.update(fields)
    return json.dumps(body).encode()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    builder = live_builder(tmp_path_factory.mktemp("tok"), SETTINGS)
    with serve(builder, SETTINGS) as app:
        yield app


def responses_counted(live, route: str, status: int) -> int:
    return live.metrics.responses.get((route, status), 0)


# ---- 1. no 500 on any input, and the connection stays usable -------------------------------------------------
NESTED = b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
UNUSABLE_BODIES = [
    ("lone surrogate in content", "/v1/chat/completions", chat("hi \ud800"),
     "messages[0].content"),
    ("lone surrogate in a prompt", "/v1/completions",
     b'{"model": "tiny", "prompt": "2 + 2 = ?\\udfff", "search": {"beam_size": 4, "beam_width": 2}}', "prompt"),
    ("lone surrogate in a key", "/v1/chat/completions", b'{"\\ud800": 1, "messages": []}', None),
    ("10 KB nested 5,000 levels deep", "/v1/chat/completions", NESTED, None),
    ("nested 100 levels in an ignored field", "/v1/chat/completions",
     b'{"x": ' + b"[" * 100 + b"]" * 100 + b', "messages": []}', None),
]


@pytest.mark.parametrize("case, path, body, param", UNUSABLE_BODIES, ids=[c[0] for c in UNUSABLE_BODIES])
def test_bodies_no_tokenizer_or_parser_can_take_are_400s_on_a_connection_that_stays_usable(live, case, path, body,
                                                                                          param):
    connection = live.connect()
    try:
        reply = connection.post_json(path, body)
        assert reply.status == 400, reply.body
        error = json.loads(reply.body)["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert reply.headers.get("connection") != "close"
        again = connection.post_json("/v1/chat/completions", chat())  # the same kept-alive connection
        assert again.status == 200 and json.loads(again.body)["choices"]
    finally:
        connection.close()


# ---- 2. every status is counted, 500 included ------------------------------------------------------------------
class BrokenBuilder(SearchBuilder):
    """A builder with a bug: what an unforeseen failure inside a handler looks like."""

    def chat(self, body, request_id):
        raise RuntimeError("a bug")


def test_an_unexpected_error_is_a_counted_500_in_the_error_format_on_a_usable_connection(tmp_path, caplog):
    builder = live_builder(tmp_path / "tok", SETTINGS, BrokenBuilder)
    with serve(builder, SETTINGS) as app, caplog.at_level(logging.ERROR):
        connection = app.connect()
        reply = connection.post_json("/v1/chat/completions", chat())
        assert reply.status == 500 and reply.headers.get("connection") != "close"
        assert json.loads(reply.body)["error"] == {"message": "internal error: RuntimeError", "type": "server_error",
                                                   "param": None, "code": None}
        assert connection.request("GET", "/health").status == 200  # the same connection still serves
        metrics = connection.request("GET", "/metrics").body.decode()
        connection.close()
    assert 'specscale_http_responses_total{route="/v1/chat/completions",status="500"} 1' in metrics
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and tracebacks[0].name == "specscale.server"  # logged once, by us


# ---- 3. an aborted upload is one debug line ------------------------------------------------------------------------
def test_clients_that_abort_their_upload_are_logged_once_each_at_debug_level(live, caplog):
    before = responses_counted(live, "/v1/chat/completions", 499)
    with caplog.at_level(logging.DEBUG):
        for aborted in range(1, 6):
            sock = socket.create_connection((live.host, live.port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n"
                         + b'{"messages": [' + b" " * 100)
            sock.close()  # mid-body: the server reads what was sent, then the end of the connection
            deadline = time.monotonic() + HANG_GUARD_S  # each disconnect counted before the next client comes
            while responses_counted(live, "/v1/chat/completions", 499) < before + aborted:
                assert time.monotonic() < deadline, f"disconnect {aborted} was not noticed"
                time.sleep(0.01)
    noisy = [r for r in caplog.records if r.levelno >= logging.INFO or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
    disconnects = [r for r in caplog.records if "disconnected after" in r.getMessage()]
    assert len(disconnects) == 5 and all(r.levelno == logging.DEBUG for r in disconnects)


# ---- 4. slow clients are timed out, open connections are capped ------------------------------------------------
# No speed limits here: each check waits for what the server does (an answer, a closed connection, its own
# connection count) under a generous hang guard, and only lower bounds are checked on the clock (a deadline
# fires no earlier than its timeout, however loaded the machine).
HANG_GUARD_S = 30.0
# the server's timer and this process's clock are read at slightly different moments (the timer arms after its
# last read, a little before the client's own reading): a cut may show a hair under its timeout here
TIMER_SLACK_S = 0.02


def _slow_client(live, sent: bytes) -> socket.socket:
    sock = socket.create_connection((live.host, live.port), timeout=HANG_GUARD_S)
    sock.sendall(sent)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    received = b""
    while marker not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed before {marker!r}: {received!r}"
        received += chunk
    return received


def test_slow_loris_clients_get_408_and_are_disconnected(live):
    """Connections that send nothing, half their headers, or headers and half their body are answered 408
    and closed once their timeout (0.5 s here) has passed, not before, while a normal client is served meanwhile."""
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n")
    partial = [b"", b"GET /health HTTP/1.1\r\n", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le",
               head, head + b'{"messages": [']
    before = responses_counted(live, "connection", 408)
    started = time.monotonic()
    slow = [_slow_client(live, sent) for sent in partial * 2]
    connection = live.connect()
    assert connection.post_json("/v1/chat/completions", chat()).status == 200
    connection.close()
    answers = [_read_until_closed(sock) for sock in slow]
    elapsed = time.monotonic() - started
    for sock in slow:
        sock.close()
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), answers
    assert all(b'"type": "timeout_error"' in answer for answer in answers)
    assert elapsed >= min(SETTINGS.header_timeout_s, SETTINGS.body_timeout_s) - TIMER_SLACK_S
    assert responses_counted(live, "connection", 408) - before == len(slow)  # counted like the app's answers


def test_a_slow_body_drip_is_cut_at_the_body_timeout(live):
    """A body sent a byte at a time, each well within any idle timeout, still has to finish in time: the
    server answers 408 and closes the connection, once the body timeout has passed."""
    before = responses_counted(live, "connection", 408)
    sock = _slow_client(live, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                        + API_KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n")
    started = time.monotonic()
    deadline = started + HANG_GUARD_S
    closed = False
    while not closed:
        assert time.monotonic() < deadline, "the server never cut the drip"
        try:
            sock.sendall(b" ")
        except OSError:  # reset: the server has closed it
            closed = True
        time.sleep(0.1)  # the drip's pace: 100 bytes take 10 s, far past the 0.5 s body timeout
        closed = closed or _peer_closed(sock)
    sock.close()
    assert time.monotonic() - started >= SETTINGS.body_timeout_s - TIMER_SLACK_S
    assert responses_counted(live, "connection", 408) - before == 1


def _peer_closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        data = sock.recv(65536)
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)
    return data == b"" or data.startswith(b"HTTP/1.1 408")


def test_a_kept_alive_connection_between_requests_is_not_cut_by_the_header_timeout(live):
    before = responses_counted(live, "connection", 408)
    connection = live.connect()
    assert connection.request("GET", "/health").status == 200
    time.sleep(SETTINGS.header_timeout_s * 3)  # the scenario: idle past the header timeout, within keep-alive
    assert connection.request("GET", "/health").status == 200
    connection.close()
    assert responses_counted(live, "connection", 408) == before


def test_the_server_keeps_an_idle_connection_longer_than_the_clients_pool_does():
    """httpx (and so the openai client) reuses an idle pooled connection for up to keepalive_expiry; a server
    that closes it sooner, or at the same moment, can close it under a request being sent on it, which fails
    that POST with a read error (the soak saw it under load). The server's idle keep-alive outlasts it."""
    settings = ServerSettings()
    config = uvicorn_config(None, settings, ServerMetrics())
    assert config.timeout_keep_alive == settings.keep_alive_s > httpx.Limits().keepalive_expiry


def test_a_connection_left_idle_after_an_early_answer_is_closed(live):
    """401 before the body was read; the client finishes the body and then sends nothing more."""
    sock = _slow_client(live, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
    early = _read_until(sock, b"}")  # the whole 401 answer, before the client sent its body
    sock.sendall(b"0123456789")
    started = time.monotonic()
    answer = early + _read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 401 ") and b"HTTP/1.1 408 " in answer
    assert time.monotonic() - started >= SETTINGS.header_timeout_s - TIMER_SLACK_S


def test_connections_beyond_the_cap_get_503_and_are_closed(live):
    live.wait_for_connections(0)  # earlier tests' connections are gone
    idle = [socket.create_connection((live.host, live.port), timeout=HANG_GUARD_S)
            for _ in range(SETTINGS.max_connections)]
    live.wait_for_connections(SETTINGS.max_connections)  # the server holds every one of them
    extra = socket.create_connection((live.host, live.port), timeout=HANG_GUARD_S)
    answer = _read_until_closed(extra)
    assert answer.startswith(b"HTTP/1.1 503 ") and b"open connections" in answer
    assert live.metrics.responses.get(("connection", 503), 0) >= 1
    idle_answers = [_read_until_closed(sock) for sock in idle]  # they time out: room again
    for sock in [*idle, extra]:
        sock.close()
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in idle_answers)
    live.wait_for_connections(0)
    connection = live.connect()
    assert connection.request("GET", "/health").status == 200
    connection.close()


# ---- 6. the small contract points --------------------------------------------------------------------------------
def test_a_trailing_slash_is_never_redirected_and_the_key_comes_first(live):
    connection = live.connect()
    try:
        anonymous = connection.request("GET", "/v1/models/", headers={"Host": "evil.example"})
        assert anonymous.status == 401 and "location" not in anonymous.headers
        keyed = connection.request("GET", "/v1/models/", headers={"Authorization": f"Bearer {API_KEY}"})
        assert keyed.status == 404 and "location" not in keyed.headers
        assert json.loads(keyed.body)["error"]["type"] == "not_found_error"
        unknown = connection.request("GET", "/v1/secret-route")
        assert unknown.status == 401  # nothing learnt about the routes without the key
    finally:
        connection.close()


@pytest.mark.parametrize("field, value", [("functions", [{"name": "f", "parameters": {}}]), ("tool_choice", "auto"),
                                          ("function_call", {"name": "f"}),
                                          ("tools", [{"type": "function", "function": {"name": "f"}}])])
def test_tool_fields_are_refused_alike(live, field, value):
    connection = live.connect()
    reply = connection.post_json("/v1/chat/completions", chat(**{field: value}))
    neutral = connection.post_json("/v1/chat/completions", chat(**{field: "none" if "choice" in field or
                                                                       "call" in field else []}))
    connection.close()
    assert reply.status == 400 and json.loads(reply.body)["error"]["param"] == field
    assert neutral.status == 200


def test_head_health_is_answered(live):
    connection = live.connect()
    reply = connection.request("HEAD", "/health")
    connection.close()
    assert reply.status == 200 and reply.body == b""


def test_health_and_metrics_are_open_by_default_and_protected_on_request(live, tmp_path):
    connection = live.connect()
    assert connection.request("GET", "/metrics").status == 200
    connection.close()
    protected = replace(SETTINGS, protect_metrics=True)
    with serve(live_builder(tmp_path / "tok", protected), protected) as app:
        connection = app.connect()
        statuses = [connection.request(method, path).status for method, path in
                    [("GET", "/metrics"), ("GET", "/health"), ("HEAD", "/health")]]
        keyed = connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
        connection.close()
    assert statuses == [401, 401, 401] and keyed.status == 200
    assert re.search(r'specscale_http_responses_total\{route="/metrics",status="401"\} 1', keyed.body.decode())


def test_an_empty_api_key_is_refused(capsys, tmp_path):
    args = Namespace(api_key="", protect_metrics=False, generator=str(tmp_path), prm=str(tmp_path))
    assert run_serve(args) == 2
    assert "empty" in capsys.readouterr().out
    with pytest.raises(ValueError, match="empty"):
        ServerSettings(api_key="")
