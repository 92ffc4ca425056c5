"""`specscale serve --backend vllm` and `specscale solve --backend vllm` on the bundled toy models, as a user runs
them (issue 47, section 4): a request through the official openai client, a cancel storm (streams dropped after
their first chunk, requests whose client gives up mid-search) after which no search, sequence or vLLM KV block is
left, a clean SIGINT stop; and solve's answer line. Each command runs in a process of its own (vLLM's in-process
engines are process-global, docs/gpu.md). Skipped, with the reason, where vLLM is not installed: run them with
`VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m pytest -q tests/test_vllm_serve.py` (docs/gpu.md)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import subprocess
import sys

import httpx
import pytest

from server_process import serving, wait_for

NEEDS_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (docs/gpu.md: .venv-vllm)")
VLLM_ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
QUESTION = "Ava has 6 apples. Ava buys 5 more. How many apples does Ava have now?"


def body(seed: int, stream: bool = False) -> dict:
    return {"model": "toy-generator", "messages": [{"role": "user", "content": QUESTION}], "seed": seed,
            "stream": stream, "search": {"preset": "specscale", "beam_size": 4}}


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    command = [sys.executable, "-m", "specscale.cli", "serve", "--backend", "vllm", "--vllm-arg",
               "enforce_eager=true", "--port", "0", "--log-level", "warning", "--no-profile-prm"]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # the subprocess inherits it
    with serving(command, log, start_timeout_s=300.0, stop_timeout_s=60.0) as server:
        yield server
    server.assert_stopped_cleanly()


@NEEDS_VLLM
def test_openai_client_gets_an_answer_from_serve_on_vllm(vllm_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{vllm_server.url}/v1", api_key="unused", timeout=300)
    reply = client.chat.completions.create(
        model="toy-generator", messages=[{"role": "user", "content": QUESTION}], seed=1,
        extra_body={"search": {"preset": "specscale", "beam_size": 4}})
    assert reply.choices[0].message.content and reply.model_extra["search"]["answer"] is not None


def drop_after_first_chunk(url: str, seed: int) -> None:
    with httpx.Client(base_url=url, timeout=300) as h, h.stream("POST", "/v1/chat/completions",
                                                                json=body(seed, stream=True)) as r:
        for line in r.iter_lines():
            if line:
                return  # the client goes away mid-search


def give_up_early(url: str, seed: int) -> None:
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/v1/chat/completions", json=body(seed), timeout=0.3)


@NEEDS_VLLM
def test_a_cancel_storm_leaves_no_search_sequence_or_vllm_block(vllm_server):
    url = vllm_server.url
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        jobs = [pool.submit(drop_after_first_chunk, url, seed) for seed in range(10)]
        jobs += [pool.submit(give_up_early, url, 100 + seed) for seed in range(6)]
        for job in jobs:
            job.result()

    def idle() -> bool:
        health = httpx.get(f"{url}/health", timeout=10).json()
        return (health["requests_running"] == 0 and health["requests_waiting"] == 0
                and health["live_sequences"] == 0 and health["kv_blocks_used"] == 0)

    wait_for(idle, "searches, sequences or vLLM KV blocks left after the storm", timeout_s=120.0)
    after = httpx.post(f"{url}/v1/chat/completions", json=body(7), timeout=300)  # still serves
    assert after.status_code == 200 and after.json()["search"]["answer"] is not None


@NEEDS_VLLM
def test_solve_on_vllm_prints_its_answers():
    done = subprocess.run([sys.executable, "-m", "specscale.cli", "solve", "--backend", "vllm", "--vllm-arg",
                           "enforce_eager=true", "--problems", "1", "--beam-size", "4"],
                          env=VLLM_ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stdout.strip(), done.stdout
