"""`specscale serve` over real HTTP on loopback: the server runs as a subprocess (`python -m specscale.cli
serve --port 0`, one torch thread) on tiny random checkpoints, and the tests talk to it with the official
`openai` client, httpx and raw sockets.

Covered: every preset through the openai client (completion, text completion, stream, parseable
errors); a table of bad inputs, each with its 4xx while the server keeps serving; overload (300
requests at once: each answered 200 or 429 + Retry-After, none hangs, zero KV blocks afterwards);
disconnect mid-stream and mid-wait, and the per-request timeout (the search is cancelled and its blocks
freed within one engine tick); metrics; the load generator; an idle server burning no CPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from server_process import serving
from specscale.search.presets import PRESETS

API_KEY = "test-key"
MODEL = "tiny"
MAX_CONCURRENCY, MAX_WAITING, MAX_BEAM_SIZE, MAX_BODY_BYTES = 4, 4, 32, 64 * 1024
HEADER_TIMEOUT_S = 3.0  # long enough for the 300-connection flood below, whose client is slow to send
QUESTION = "Tom has 12 apples. He buys 7 more. How many apples does Tom have?"
# a search of a few 16-token steps: ~0.05 s on the tiny models
FAST = {"beam_size": 4, "beam_width": 2, "max_rounds": 3}
# a search of many 64-token rounds over 32 candidates: ~1 s, long enough to cancel in the middle
LONG = {"preset": "beam", "beam_size": 32, "beam_width": 4, "max_rounds": 40}
LONG_SAMPLING = {"max_tokens": 64, "temperature": 1.2}


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def wait_idle(self, timeout_s: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            health = self.health()
            if health["requests_running"] == 0 and health["requests_waiting"] == 0:
                return health
            time.sleep(0.02)
        raise AssertionError(f"the server did not go idle: {self.health()}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    generator = build_stepping_generator(tmp_path_factory.mktemp("gen"), eos_rate=0.0)
    prm = build_qwen_prm_checkpoint(tmp_path_factory.mktemp("prm"))
    log = tmp_path_factory.mktemp("server") / "server.log"
    command = [
        sys.executable, "-m", "specscale.cli", "serve", "--port", "0", "--generator", str(generator), "--prm", str(prm),
        "--served-model-name", MODEL, "--api-key", API_KEY, "--threads", "1",
        "--max-concurrency", str(MAX_CONCURRENCY), "--max-waiting", str(MAX_WAITING),
        "--max-beam-size", str(MAX_BEAM_SIZE), "--max-body-bytes", str(MAX_BODY_BYTES), "--request-timeout", "60",
        "--generator-kv-gb", "0.1", "--prm-kv-gb", "0.1", "--lv-threshold-tokens", "256", "--log-level", "warning",
        "--header-timeout", str(HEADER_TIMEOUT_S),
    ]
    with serving(command, log) as running:
        yield Server(running.url, running.process, log)
    running.assert_stopped_cleanly()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def http(server, key: str | None = API_KEY, timeout: float = 60) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=timeout)


def chat_body(search: dict | None = None, **fields) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16, "seed": 7,
            "search": dict(FAST, **(search or {}))}
    body.update(fields)
    return body


def extras(obj) -> dict:
    """The extension fields of an openai response object."""
    return obj.model_extra or {}


# ---- the openai client, every preset --------------------------------------------------------------------
def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert sorted(extras(models[0])["presets"]) == sorted(PRESETS)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_completes_streams_and_errors_through_the_openai_client(client, server, preset):
    search = dict(FAST, preset=preset)
    messages = [{"role": "user", "content": QUESTION}]
    completion = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, n=2, seed=3,
                                                extra_body={"search": search})
    assert completion.object == "chat.completion" and 1 <= len(completion.choices) <= 2
    summary = extras(completion)["search"]
    assert summary["preset"] == preset
    for choice in completion.choices:
        fields = extras(choice)
        assert choice.message.role == "assistant" and choice.message.content
        assert fields["step_scores"] and all(0.0 <= s <= 1.0 for s in fields["step_scores"])
        assert fields["copies"] >= 1
    scores = [extras(c)["score"] for c in completion.choices]
    assert scores == sorted(scores, reverse=True)  # best path first
    usage, usage_extra = completion.usage, extras(completion.usage)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 < usage.completion_tokens <= usage_extra["search_output_tokens"]
    assert usage_extra["generated_tokens"] > 0 and usage_extra["wasted_tokens"] >= 0

    text = client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=16, seed=3,
                                     extra_body={"search": search})
    assert text.object == "text_completion" and text.choices[0].text
    assert extras(text.choices[0])["step_scores"]

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, seed=3, stream=True,
                                                 stream_options={"include_usage": True}, extra_body={"search": search}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    progress = [extras(c)["search_progress"] for c in chunks if "search_progress" in extras(c)]
    if preset != "best-of-n":  # best-of-N decides no round: it samples whole solutions once
        assert progress and all(0.0 <= p["best_score"] <= 1.0 and p["best_path"] for p in progress)
        assert [p["round"] for p in progress] == sorted(p["round"] for p in progress)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # "length": the last step was cut by max_tokens (docs/design.md, "Finish reasons")
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason in ("stop", "length")]
    assert content and finish and extras(finish[-1].choices[0])["step_scores"]
    assert extras(finish[-1])["search"]["preset"] == preset
    stream_usage = chunks[-1].usage
    assert chunks[-1].choices == [] and stream_usage.completion_tokens > 0
    assert stream_usage.total_tokens == stream_usage.prompt_tokens + stream_usage.completion_tokens

    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=messages,
                                       extra_body={"search": dict(search, beam_size=6, beam_width=4)})
    assert bad.value.status_code == 400 and bad.value.param == "search.beam_size"
    assert "multiple" in bad.value.message
    with pytest.raises(openai.BadRequestError) as bad_stream:
        client.chat.completions.create(model=MODEL, messages=messages, stream=True, temperature=2.5,
                                       extra_body={"search": search})
    assert bad_stream.value.param == "temperature"
    assert server.wait_idle()["kv_blocks_used"] == 0


def test_n_returns_the_top_paths_and_answer_selection_orders_them(server):
    with http(server) as h:
        body = h.post("/v1/chat/completions", json=chat_body({"beam_size": 8, "beam_width": 4}, n=8)).json()
        voted = h.post("/v1/chat/completions", json=chat_body({"beam_size": 8, "beam_width": 4,
                                                               "answer_selection": "weighted_vote"}, n=8)).json()
    choices = body["choices"]
    assert [c["index"] for c in choices] == list(range(len(choices))) and 1 <= len(choices) <= 8
    assert sum(c["copies"] for c in choices) <= 8
    assert body["usage"]["completion_tokens"] <= body["usage"]["search_output_tokens"]
    assert voted["search"]["answer_selection"] == "weighted_vote"
    answer = voted["search"]["answer"]
    agreeing = [c["answer"] == answer for c in voted["choices"]]
    assert agreeing == sorted(agreeing, reverse=True)  # the voted answer's paths come first


def test_stream_is_sse_in_the_openai_chunk_format_ending_with_done(server):
    with http(server) as h, h.stream("POST", "/v1/completions",
                                     json={"model": MODEL, "prompt": QUESTION, "max_tokens": 16, "stream": True,
                                           "search": FAST}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(line[len("data: "):]) for line in events[:-1]]
    assert all(p["object"] == "text_completion" for p in payloads)
    assert any("search_progress" in p for p in payloads)
    assert "".join(p["choices"][0]["text"] for p in payloads if p["choices"])


# ---- bad input ------------------------------------------------------------------------------------------
LONG_PROMPT = "1 + 2 = 3. " * 400  # ~2,400 tokens, under the body limit, over the 512-token context
OVERSIZED = "x" * (MAX_BODY_BYTES + 1)

BAD_INPUTS = [
    # (case, path, body: dict | bytes, api key, status, param or None, words in the message)
    ("malformed json", "/v1/chat/completions", b'{"messages": [', API_KEY, 400, None, "not valid JSON"),
    ("body not an object", "/v1/chat/completions", b"[1, 2]", API_KEY, 400, None, "JSON object"),
    ("NaN is not JSON", "/v1/chat/completions", b'{"messages": [], "temperature": NaN}', API_KEY, 400, None, "NaN"),
    ("missing messages", "/v1/chat/completions", {"model": MODEL}, API_KEY, 400, "messages", "Field required"),
    ("empty messages", "/v1/chat/completions", chat_body(messages=[]), API_KEY, 400, "messages", "at least one"),
    ("last message not the user's", "/v1/chat/completions",
     chat_body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]), API_KEY, 400,
     "messages", "last message"),
    ("unknown role", "/v1/chat/completions", chat_body(messages=[{"role": "wizard", "content": "hi"}]), API_KEY, 400,
     "messages[0].role", "role"),
    ("content of the wrong type", "/v1/chat/completions", chat_body(messages=[{"role": "user", "content": 5}]),
     API_KEY, 400, "messages[0].content", "valid string"),
    ("unknown preset", "/v1/chat/completions", chat_body({"preset": "greedy"}), API_KEY, 400, "search.preset",
     "unknown preset"),
    ("beam size not a multiple of beam width", "/v1/chat/completions", chat_body({"beam_size": 6, "beam_width": 4}),
     API_KEY, 400, "search.beam_size", "multiple"),
    ("beam size above the server limit", "/v1/chat/completions", chat_body({"beam_size": 64, "beam_width": 4}),
     API_KEY, 400, "search.beam_size", "limit"),
    ("n above beam size", "/v1/chat/completions", chat_body(n=5), API_KEY, 400, "n", "beam_size"),
    ("unknown search field", "/v1/chat/completions", chat_body({"beam_sise": 4}), API_KEY, 400, "search.beam_sise",
     "not permitted"),
    ("beam size of the wrong type", "/v1/chat/completions", chat_body({"beam_size": "4"}), API_KEY, 400,
     "search.beam_size", "integer"),
    ("temperature too high", "/v1/chat/completions", chat_body(temperature=2.5), API_KEY, 400, "temperature", "2"),
    ("temperature of the wrong type", "/v1/chat/completions", chat_body(temperature="hot"), API_KEY, 400,
     "temperature", "number"),
    ("top_p zero", "/v1/chat/completions", chat_body(top_p=0), API_KEY, 400, "top_p", "greater than 0"),
    ("top_p above one", "/v1/chat/completions", chat_body(top_p=1.5), API_KEY, 400, "top_p", "less than or equal"),
    ("max_tokens zero", "/v1/chat/completions", chat_body(max_tokens=0), API_KEY, 400, "max_tokens", "greater"),
    ("negative seed", "/v1/chat/completions", chat_body(seed=-1), API_KEY, 400, "seed", "greater"),
    ("stream not a boolean", "/v1/chat/completions", chat_body(stream="yes"), API_KEY, 400, "stream", "boolean"),
    ("non-positive timeout", "/v1/chat/completions", chat_body({"timeout_s": 0}), API_KEY, 400, "search.timeout_s",
     "greater"),
    ("stop strings", "/v1/chat/completions", chat_body(stop=["\n"]), API_KEY, 400, "stop", "not supported"),
    ("prompt longer than the context", "/v1/chat/completions",
     chat_body(messages=[{"role": "user", "content": LONG_PROMPT}]), API_KEY, 400, "messages", "context"),
    ("body over the size limit", "/v1/chat/completions", chat_body(messages=[{"role": "user", "content": OVERSIZED}]),
     API_KEY, 413, None, "limit"),
    ("unknown model", "/v1/chat/completions", chat_body(model="gpt-9"), API_KEY, 404, "model", "does not exist"),
    ("several prompts", "/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, API_KEY, 400, "prompt",
     "one prompt"),
    ("empty prompt", "/v1/completions", {"model": MODEL, "prompt": "  "}, API_KEY, 400, "prompt", "empty"),
    ("prompt of the wrong type", "/v1/completions", {"model": MODEL, "prompt": 42}, API_KEY, 400, "prompt", "string"),
    ("echo", "/v1/completions", {"model": MODEL, "prompt": "hi", "echo": True}, API_KEY, 400, "echo", "not supported"),
    ("lone surrogate", "/v1/chat/completions",
     json.dumps(chat_body(messages=[{"role": "user", "content": "hi \ud800"}])).encode(), API_KEY, 400,
     "messages[0].content", "surrogate"),
    ("nested 5,000 levels", "/v1/chat/completions", b"[" * 5000 + b"]" * 5000, API_KEY, 400, None, "deeper"),
    ("tool_choice", "/v1/chat/completions", chat_body(tool_choice="auto"), API_KEY, 400, "tool_choice", "tool calls"),
    ("missing API key", "/v1/chat/completions", chat_body(), None, 401, None, "API key"),
    ("wrong API key", "/v1/chat/completions", chat_body(), "nope", 401, None, "API key"),
]


@pytest.mark.parametrize("case, path, body, key, status, param, words", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_its_4xx_and_the_server_keeps_serving(server, case, path, body, key, status, param, words):
    with http(server, key) as h:
        if isinstance(body, bytes):
            response = h.post(path, content=body, headers={"Content-Type": "application/json"})
        else:
            response = h.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert words in error["message"], error["message"]
    assert server.health()["status"] == "ok"


def test_health_and_the_start_up_log_report_resident_memory(server):
    memory = server.health()["memory"]
    assert memory["process_rss_mib"] > memory["generator"]["total_mib"] + memory["prm"]["total_mib"]
    for model in ("generator", "prm"):
        assert memory[model]["device"] == "cpu" and memory[model]["weights_mib"] > 0
        assert memory[model]["kv_cache_mib"] == pytest.approx(0.1 * 1024, rel=0.05)  # --generator-kv-gb 0.1
    log = server.log.read_text()
    assert "SpecScale generator memory: " in log and "SpecScale PRM memory: " in log
    assert re.search(r"SpecScale process resident memory: [\d,]+ MiB", log)


def test_the_server_still_answers_after_the_bad_inputs(client, server):
    completion = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                                max_tokens=16, extra_body={"search": FAST})
    assert completion.choices[0].message.content
    routes = server.metrics()
    assert 'specscale_http_responses_total{route="/v1/chat/completions",status="400"}' in routes


def test_unknown_routes_and_methods_answer_in_the_openai_error_format(server):
    with http(server) as h:
        missing, method = h.get("/v1/nothing"), h.get("/v1/chat/completions")
        slash = h.get("/v1/models/")
    assert missing.status_code == 404 and "error" in missing.json()
    assert method.status_code == 405 and "error" in method.json()
    assert slash.status_code == 404 and "location" not in slash.headers  # no redirect


def test_a_client_that_sends_no_request_is_answered_408_and_disconnected(server):
    host, port = server.url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ") and b"timeout_error" in answer
    # cut by the header timeout, not before it (20 ms for the server's timer arming before this clock's reading)
    assert time.monotonic() - started >= HEADER_TIMEOUT_S - 0.02


# ---- overload --------------------------------------------------------------------------------------------
def test_overload_every_request_is_answered_and_no_kv_block_stays_in_use(server):
    """300 requests at once against 4 running + 4 waiting: each gets 200 or 429 (with Retry-After), none
    hangs, the waiting queue never exceeds its bound, and afterwards no KV block is in use."""
    statuses, retry_after, waiting_seen = asyncio.run(_flood(server, 300))
    assert len(statuses) == 300
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert statuses.count(200) >= MAX_CONCURRENCY and statuses.count(429) > 0
    assert retry_after and all(value.isdigit() for value in retry_after)
    assert max(waiting_seen) <= MAX_WAITING  # /health counts what the bound counts
    health = server.wait_idle()
    assert health["kv_blocks_used"] == 0 and health["live_sequences"] == 0
    print(f"overload: {statuses.count(200)} answered 200, {statuses.count(429)} refused 429; "
          f"most waiting seen {max(waiting_seen)}")


async def _flood(server, count: int):
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    waiting_seen = [0]
    done = asyncio.Event()

    async def watch(client):
        while not done.is_set():
            waiting_seen.append((await client.get("/health")).json()["requests_waiting"])
            await asyncio.sleep(0.01)

    async with httpx.AsyncClient(base_url=server.url, headers=headers, limits=limits, timeout=60) as client:
        watcher = asyncio.create_task(watch(client))
        bodies = [chat_body(seed=i) for i in range(count)]
        responses = await asyncio.wait_for(
            asyncio.gather(*(client.post("/v1/chat/completions", json=b) for b in bodies)), timeout=120)
        done.set()
        await watcher
    statuses = [r.status_code for r in responses]
    retry_after = [r.headers.get("retry-after", "") for r in responses if r.status_code == 429]
    for r in responses:
        assert "error" in r.json() if r.status_code != 200 else r.json()["choices"]
    return statuses, retry_after, waiting_seen


# ---- cancellation ------------------------------------------------------------------------------------------
def _cancel_counts(server) -> dict:
    text = server.metrics()
    counts = {reason: int(value) for reason, value in
              re.findall(r'specscale_requests_cancelled_total\{reason="(\w+)"\} (\d+)', text)}
    counts["within_one_tick"] = int(re.search(r'specscale_cancel_delay_ticks_bucket\{le="1"\} (\d+)', text).group(1))
    counts["all"] = int(re.search(r"specscale_cancel_delay_ticks_count (\d+)", text).group(1))
    return counts


def _raw_post(server, body: dict) -> socket.socket:
    payload = json.dumps(body).encode()
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    sock.sendall(head + payload)
    return sock


def _wait_for_cancel(server, before: dict, reason: str, timeout_s: float = 10.0) -> tuple[dict, float]:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        counts = _cancel_counts(server)
        if counts.get(reason, 0) > before.get(reason, 0):
            return counts, time.monotonic() - start
        time.sleep(0.005)
    raise AssertionError(f"no {reason} cancellation recorded: {_cancel_counts(server)}")


def test_disconnect_mid_stream_frees_the_requests_blocks_within_one_tick(server):
    server.wait_idle()
    before = _cancel_counts(server)
    sock = _raw_post(server, chat_body(LONG, stream=True, **LONG_SAMPLING))
    received = b""
    while b"search_progress" not in received:  # mid-stream: a round was decided, more are coming
        chunk = sock.recv(65536)
        assert chunk, "the stream ended before its first progress event"
        received += chunk
    running = server.health()
    assert running["requests_running"] == 1 and running["kv_blocks_used"] > 0
    sock.close()
    after, noticed_s = _wait_for_cancel(server, before, "disconnect")
    health = server.health()
    assert health["kv_blocks_used"] == 0 and health["live_sequences"] == 0 and health["requests_running"] == 0
    assert after["all"] == before["all"] + 1
    assert after["within_one_tick"] == before["within_one_tick"] + 1  # freed before the engine's next tick
    print(f"disconnect mid-stream: {running['kv_blocks_used']} KV blocks in use before, 0 after; "
          f"the cancellation was visible in /metrics {noticed_s * 1000:.0f} ms after the client closed")


def test_disconnect_while_waiting_for_a_non_streaming_answer_cancels_the_search(server):
    server.wait_idle()
    before = _cancel_counts(server)
    sock = _raw_post(server, chat_body(LONG, **LONG_SAMPLING))
    deadline = time.monotonic() + 10
    while server.health()["kv_blocks_used"] == 0:  # the search is running and holds KV
        assert time.monotonic() < deadline, "the search never started"
        time.sleep(0.005)
    sock.close()
    after, _ = _wait_for_cancel(server, before, "disconnect")
    assert after["within_one_tick"] == before["within_one_tick"] + 1
    health = server.health()
    assert health["kv_blocks_used"] == 0 and health["requests_running"] == 0


def test_timeout_cancels_the_search_and_returns_an_error(client, server):
    server.wait_idle()
    before = _cancel_counts(server)
    with http(server) as h:
        response = h.post("/v1/chat/completions", json=chat_body(dict(LONG, timeout_s=0.15), **LONG_SAMPLING))
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "timeout" and "time budget" in response.json()["error"]["message"]
    after, _ = _wait_for_cancel(server, before, "timeout")
    assert after["within_one_tick"] == before["within_one_tick"] + 1
    assert server.health()["kv_blocks_used"] == 0
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                            stream=True, extra_body={"search": dict(LONG, timeout_s=0.15)},
                                            **LONG_SAMPLING)
    with pytest.raises(openai.APIError, match="time budget"):  # an error event inside the stream
        list(stream)
    assert server.wait_idle()["kv_blocks_used"] == 0


# ---- metrics, the load generator, idling ---------------------------------------------------------------------
def test_metrics_are_prometheus_text_with_the_serving_series(server):
    text = server.metrics()
    for series in ("specscale_requests_running ", "specscale_requests_waiting ", "specscale_kv_blocks_used ",
                   "specscale_generated_tokens_per_second ", "specscale_verifier_batch_size_bucket{le=",
                   'specscale_request_latency_seconds_bucket{preset="beam",le="+Inf"}',
                   'specscale_request_latency_seconds_count{preset="specscale"}'):
        assert series in text, series
    for line in text.splitlines():
        assert line.startswith("#") or re.fullmatch(r"[a-z_]+(\{[^}]*\})? [-+0-9.e]+|[a-z_]+(\{[^}]*\})? [+-]?inf",
                                                    line, re.IGNORECASE), line


def test_bench_serve_measures_a_running_server(server, tmp_path):
    from specscale_lab.bench.serve import run

    args = SimpleNamespace(url=server.url, rate=40.0, burstiness=0.5, num_requests=8, preset="ep+cd", beam_size=4,
                           beam_width=2, max_rounds=3, max_tokens=16, temperature=None, model=None, api_key=API_KEY,
                           timeout=60.0, seed=0, out=str(tmp_path))
    assert run(args) == 0
    report = json.loads((tmp_path / "serve.json").read_text())
    summary = report["summary"]
    assert summary["requests"] == 8 and summary["completed"] + sum(summary["errors_by_status"].values()) == 8
    assert set(summary["errors_by_status"]) <= {"429"}
    assert summary["completed"] and summary["output_tokens_per_s"] > 0
    assert summary["latency_s"]["p50"] <= summary["latency_s"]["p99"]
    assert summary["normalized_latency_s_per_token"]["p50"] > 0
    assert "| request throughput |" in (tmp_path / "serve.md").read_text()


def test_an_idle_server_sleeps(server):
    """No busy loop: while idle the engine thread runs no tick and the process uses (almost) no CPU."""
    ticks = server.wait_idle()["ticks"]
    cpu_before = _cpu_seconds(server.process.pid)
    time.sleep(1.0)
    cpu_used = _cpu_seconds(server.process.pid) - cpu_before
    assert server.health()["ticks"] == ticks
    assert cpu_used < 0.2, f"an idle server used {cpu_used:.2f} s of CPU in 1 s"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
