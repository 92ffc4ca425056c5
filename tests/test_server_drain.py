"""`specscale serve` drained by SIGTERM under load (issue 30): a subprocess on tiny random checkpoints holds
running searches, streamed and not, when it gets SIGTERM. The running ones finish with their answers (one
hits its own time budget: 504), a new request meanwhile gets 503 + Retry-After and /health says
"draining", the process exits 0 and reports that it left no search, KV block or runtime work behind."""

from __future__ import annotations

import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from server_process import serving

MODEL = "tiny"
QUESTION = "Tom has 12 apples. He buys 7 more. How many apples does Tom have?"
LONG = {"preset": "beam", "beam_size": 8, "beam_width": 4, "max_rounds": 6}  # a second or more: time to drain
BUDGETED = {"preset": "beam", "beam_size": 32, "beam_width": 4, "max_rounds": 1000, "timeout_s": 2.0}  # 504


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
        answers = [pool.submit(h.post, "/v1/chat/completions", json=body(LONG, seed=seed)) for seed in (1, 2)]
        budgeted = pool.submit(h.post, "/v1/chat/completions", json=body(BUDGETED))
        stream = pool.submit(_streamed_lines, server.url, body(LONG, stream=True))
        _wait_for(lambda: h.get("/health").json()["requests_running"] == 4, "the searches did not start")
        server.process.send_signal(signal.SIGTERM)
        _wait_for(lambda: h.get("/health").json()["status"] == "draining", "the server did not start draining")
        assert h.get("/health").status_code == 503  # a load balancer's probe moves away
        refused = h.post("/v1/chat/completions", json=body(LONG))
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "draining"
        for answer in answers:
            assert answer.result().status_code == 200 and answer.result().json()["choices"][0]["message"]["content"]
        assert budgeted.result().status_code == 504 and budgeted.result().json()["error"]["code"] == "timeout"
        lines = stream.result()
        assert lines[-1] == "data: [DONE]" and any('"finish_reason"' in line for line in lines)
        assert not any('"error"' in line for line in lines)
        server.exit_code = server.process.wait(timeout=60)
    server.assert_stopped_cleanly()
    log = server.log.read_text()
    assert ("SpecScale drained (every search finished): 0 searches cancelled at exit, 0 running, 0 generator KV "
            "blocks in use, 0 live sequences, runtime work left: no") in log, log[-3000:]


def _streamed_lines(url: str, payload: dict) -> list[str]:
    with httpx.Client(base_url=url, timeout=150) as h, h.stream("POST", "/v1/chat/completions", json=payload) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def _wait_for(condition, message: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)
