"""`specscale serve --ray` as a user runs it: a subprocess that starts its own local Ray instance, prints
where it serves once its replica is up, answers the OpenAI API, and on SIGTERM drains — the searches it
holds, streamed and not, finish with their answers while a new request gets 503 + Retry-After and /health
says "draining" — then reports that its replica holds no search and no KV block, removes its application and
stops the Ray instance it started (exit 0, "SpecScale stopped"). Tiny random checkpoints, one replica."""

from __future__ import annotations

import signal
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from server_process import RAY_URL, serving, streamed_lines, wait_for

QUESTION = "Tom has 12 apples. He buys 7 more. How many apples does Tom have?"
LONG = {"preset": "beam", "beam_size": 16, "beam_width": 4, "max_rounds": 12}


def body(search: dict, **fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 64,
            "temperature": 1.2, "seed": 1, "search": search, **fields}


def test_serve_ray_serves_drains_on_sigterm_and_stops_cleanly(tmp_path):
    generator = build_stepping_generator(tmp_path / "gen", eos_rate=0.0)
    prm = build_qwen_prm_checkpoint(tmp_path / "prm")
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "specscale.cli", "serve", "--ray", "--replicas", "1", "--replica-cpus", "0.5",
               "--threads", "1", "--port", "0", "--generator", str(generator), "--prm", str(prm),
               "--served-model-name", "tiny", "--generator-kv-gb", "0.1", "--prm-kv-gb", "0.1",
               "--lv-threshold-tokens", "256", "--request-timeout", "120", "--log-level", "warning"]
    with serving(command, log, RAY_URL, check_health=False, start_timeout_s=240.0, stop_signal=signal.SIGTERM,
                 stop_timeout_s=60.0) as server, httpx.Client(base_url=server.url, timeout=120) as h, \
            ThreadPoolExecutor(2) as pool:
        fast = {"beam_size": 4, "beam_width": 2, "max_rounds": 3}
        answer = h.post("/v1/chat/completions", json=body(fast, max_tokens=16))
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
        assert h.get("/health").json()["replicas_healthy"] == 1
        whole = pool.submit(h.post, "/v1/chat/completions", json=body(LONG, seed=2))
        stream = pool.submit(streamed_lines, server.url, body(LONG, stream=True))
        wait_for(lambda: h.get("/health").json()["requests_running"] == 2, "the searches did not start")
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: h.get("/health").json()["status"] == "draining", "the ingress did not start draining")
        assert h.get("/health").status_code == 503
        refused = h.post("/v1/chat/completions", json=body(fast))
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "draining"
        assert whole.result().status_code == 200 and whole.result().json()["choices"][0]["message"]["content"]
        lines = stream.result()
        assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
        server.exit_code = server.process.wait(timeout=120)
    server.assert_stopped_cleanly()
    assert ("SpecScale drained (every search finished): 0 requests open at the ingress; 1 search replicas: "
            "0 running, 0 waiting, 0 generator KV blocks in use, 0 live sequences") in log.read_text()

