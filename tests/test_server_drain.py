"""`specscale serve` drained by SIGTERM under load (issue 30): a subprocess on tiny random checkpoints holds
running searches, streamed and not, when it gets SIGTERM. The running ones finish with their answers, a new
request meanwhile gets 503 + Retry-After and /health says "draining", the process exits 0 and reports that
it left no search, KV block or runtime work behind. Without a subprocess: a drain ends at its timeout when
a search outlasts it, and a second signal ends it at once."""

from __future__ import annotations

import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from server_process import serving, streamed_lines, wait_for

MODEL = "tiny"
QUESTION = "Tom has 12 apples. He buys 7 more. How many apples does Tom have?"
LONG = {"preset": "beam", "beam_size": 16, "beam_width": 4, "max_rounds": 12}  # a second or so: time to drain


def body(search: dict, **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 64,
            "temperature": 1.2, "seed": 3, "search": search, **fields}


def test_sigterm_drains_running_searches_refuses_new_ones_and_exits_0(tmp_path):
    generator = build_stepping_generator(tmp_path / "gen", eos_rate=0.0)
    prm = build_qwen_prm_checkpoint(tmp_path / "prm")
    command = [sys.executable, "-m", "specscale.cli", "serve", "--port", "0", "--generator", str(generator),
               "--prm", str(prm), "--served-model-name", MODEL, "--threads", "1", "--max-concurrency", "4",
               "--generator-kv-gb", "0.1", "--prm-kv-gb", "0.1", "--lv-threshold-tokens", "256",
               "--request-timeout", "120", "--log-level", "warning"]
    with serving(command, tmp_path / "serve.log", stop_signal=signal.SIGTERM, stop_timeout_s=150) as server, \
            httpx.Client(base_url=server.url, timeout=150) as h, ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(h.post, "/v1/chat/completions", json=body(LONG, seed=seed)) for seed in (1, 2, 4)]
        stream = pool.submit(streamed_lines, server.url, body(LONG, stream=True))
        running = _once_all_accepted(h, 4)
        server.process.send_signal(signal.SIGTERM)
        assert running >= 1, "every search had finished before SIGTERM"
        wait_for(lambda: h.get("/health").json()["status"] == "draining", "the server did not start draining")
        assert h.get("/health").status_code == 503  # a load balancer's probe moves away
        refused = h.post("/v1/chat/completions", json=body(LONG))
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "draining"
        for answer in answers:
            assert answer.result().status_code == 200 and answer.result().json()["choices"][0]["message"]["content"]
        lines = stream.result()
        assert lines[-1] == "data: [DONE]" and any('"finish_reason"' in line for line in lines)
        assert not any('"error"' in line for line in lines)
        server.exit_code = server.process.wait(timeout=60)
    server.assert_stopped_cleanly()
    log = server.log.read_text()
    assert ("SpecScale drained (every search finished): 0 searches cancelled at exit, 0 running, 0 generator KV "
            "blocks in use, 0 live sequences, runtime work left: no") in log, log[-3000:]



def _once_all_accepted(h: httpx.Client, count: int) -> int:
    """Waits until the server has accepted `count` searches (finished ones read from /metrics first, then
    the running and waiting ones from /health: a search finishing in between is counted in neither, never
    twice); returns how many were running then."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the server did not accept the searches"
        metrics = h.get("/metrics").text
        finished = sum(int(float(v)) for v in re.findall(r'^specscale_searches_total\{[^}]*\} (\S+)$', metrics, re.M))
        health = h.get("/health").json()
        if finished + health["requests_running"] + health["requests_waiting"] >= count:
            return health["requests_running"]
        time.sleep(0.01)


class StubLoop:
    """What DrainingServer asks of the engine loop: drain, and whether it is idle yet."""

    def __init__(self):
        self.draining = False
        self.busy = True

    def drain(self) -> None:
        self.draining = True

    def idle(self) -> bool:
        return not self.busy


def _draining_server(drain_timeout_s: float):
    import uvicorn

    from specscale.server.draining_server import DrainingServer

    loop = StubLoop()
    return DrainingServer(uvicorn.Config(app=None), loop, drain_timeout_s), loop


def test_a_drain_waits_for_the_searches_until_its_timeout_and_a_second_signal_ends_it():
    import asyncio

    server, loop = _draining_server(drain_timeout_s=3600)
    server.handle_exit(signal.SIGTERM, None)
    assert loop.draining and not asyncio.run(server.on_tick(1)) and not server.should_exit  # still busy
    loop.busy = False
    assert asyncio.run(server.on_tick(1)) and server.drained_in_time is True

    server, loop = _draining_server(drain_timeout_s=0)  # a search outlasting the drain: it ends anyway
    server.handle_exit(signal.SIGTERM, None)
    assert asyncio.run(server.on_tick(1)) and server.drained_in_time is False

    server, loop = _draining_server(drain_timeout_s=3600)
    server.handle_exit(signal.SIGTERM, None)
    server.handle_exit(signal.SIGTERM, None)  # the second signal: no more waiting
    assert server.should_exit and not server.force_exit and server.drained_in_time is None
    server.handle_exit(signal.SIGINT, None)
    assert server.force_exit
    assert not server._captured_signals  # nothing re-raised after the shutdown: the process exits 0
