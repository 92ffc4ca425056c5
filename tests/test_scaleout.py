"""`specscale serve --ray` on a local Ray instance started by the test (`ray.init(num_cpus=2)`): two search
replicas (tiny random checkpoints, one torch thread each) behind the Ray Serve ingress, spoken to over
HTTP with the official `openai` client and httpx.

Covered: concurrent requests, streamed and not, answered by both replicas, the same seed giving the same
answer on either; /v1/models, /health per replica and in total, /metrics summed over the replicas; a
client that disconnects mid-stream has its search cancelled on the replica that runs it, with the KV
freed within one engine tick; overload answers 429 + Retry-After and nothing hangs; a replica killed in
the middle of a load of seeded searches: every request answers 200 (re-run on the other replica), the
metrics count the re-runs and Ray Serve brings the replica back. No test relies on what ran before it.
Ray and Serve are shut down however the tests end.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai
import pytest
import ray
from ray import serve

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from specscale.pipeline import PipelineConfig
from specscale.scaleout.application import APP_NAME, build_application
from specscale.scaleout.command import free_port
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.ingress import REPLICA_HEADER
from specscale.server.settings import ServerSettings

MODEL = "tiny"
API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
REPLICAS, MAX_CONCURRENCY, MAX_WAITING = 2, 2, 2
QUESTION = "Tom has 12 apples. He buys 7 more. How many apples does Tom have?"
FAST = {"beam_size": 4, "beam_width": 2, "max_rounds": 3}  # a few 16-token steps: well under a second
LONG = {"preset": "beam", "beam_size": 64, "beam_width": 4, "max_rounds": 40}  # about a second: time to cancel
LONG_SAMPLING = {"max_tokens": 64, "temperature": 1.2}


@dataclass
class Cluster:
    url: str

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text

    def replica(self, replica_id: str) -> dict:
        return next(r for r in self.health()["replicas"] if r["replica_id"] == replica_id)

    def wait_idle(self, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            health = self.health()
            if health["requests_running"] == 0 and health["requests_waiting"] == 0 and health["kv_blocks_used"] == 0:
                return health
            time.sleep(0.05)
        raise AssertionError(f"the cluster did not go idle: {self.health()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    generator = build_stepping_generator(tmp_path_factory.mktemp("gen"), eos_rate=0.0)
    prm = build_qwen_prm_checkpoint(tmp_path_factory.mktemp("prm"))
    config = ScaleOutConfig(
        PipelineConfig(generator=str(generator), prm=str(prm), generator_kv_gb=0.1, prm_kv_gb=0.1,
                       max_concurrency=MAX_CONCURRENCY, lv_threshold_tokens=256),
        ServerSettings(served_model_name=MODEL, max_waiting=MAX_WAITING, max_beam_size=64, request_timeout_s=60,
                       api_key=API_KEY),
        replicas=REPLICAS, replica_cpus=0.5, threads=1, health_check_period_s=1.0,
    )
    port = free_port("127.0.0.1")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_application(config), name=APP_NAME, route_prefix="/",
                  logging_config={"log_level": "WARNING", "enable_access_log": False})
        yield Cluster(f"http://127.0.0.1:{port}")
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def chat_body(search: dict | None = None, **fields) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16, "seed": 7,
            "search": dict(FAST, **(search or {}))}
    body.update(fields)
    return body


def metric(text: str, series: str) -> float:
    """The value of one series ('name' or 'name{labels}') in a Prometheus exposition (0 if absent)."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


# ---- two replicas, one API ----------------------------------------------------------------------------
def test_models_and_health_report_every_replica(client, cluster):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = cluster.health()
    assert health["status"] == "ok" and health["replicas_healthy"] == REPLICAS
    assert len({r["replica_id"] for r in health["replicas"]}) == REPLICAS
    assert health["kv_blocks_total"] == sum(r["kv_blocks_total"] for r in health["replicas"])


def test_two_replicas_answer_concurrent_requests_streamed_and_not(client, cluster):
    def complete(seed: int):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, seed=seed,
            extra_body={"search": FAST})
        return raw.headers[REPLICA_HEADER], raw.parse()

    def stream(seed: int):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, seed=seed, stream=True,
            extra_body={"search": FAST})
        chunks = list(raw.parse())
        return raw.headers[REPLICA_HEADER], chunks

    per_kind = REPLICAS * (MAX_CONCURRENCY + MAX_WAITING) // 2  # together, what the replicas hold
    with ThreadPoolExecutor(2 * per_kind) as pool:
        answers = [pool.submit(complete, seed) for seed in range(per_kind)]
        streams = [pool.submit(stream, seed) for seed in range(per_kind)]
        answers, streams = [f.result() for f in answers], [f.result() for f in streams]
    assert all(completion.choices[0].message.content for _, completion in answers)
    for _, chunks in streams:
        assert any("search_progress" in (c.model_extra or {}) for c in chunks)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    served_by = {replica for replica, _ in answers + streams}
    assert len(served_by) == REPLICAS, f"one replica served everything: {served_by}"
    assert all(r["ticks"] > 0 for r in cluster.health()["replicas"])
    cluster.wait_idle()


def test_the_same_seed_gives_the_same_answer_on_either_replica(client):
    def complete(_):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, seed=11, n=2,
            extra_body={"search": FAST})
        completion = raw.parse()
        return raw.headers[REPLICA_HEADER], [(c.message.content, (c.model_extra or {})["score"])
                                             for c in completion.choices]

    by_replica: dict[str, set] = {}
    for _ in range(3):  # concurrent rounds so that both replicas get some
        with ThreadPoolExecutor(6) as pool:
            for replica, paths in pool.map(complete, range(6)):
                by_replica.setdefault(replica, set()).add(json.dumps(paths))
        if len(by_replica) == REPLICAS:
            break
    assert len(by_replica) == REPLICAS, f"only {sorted(by_replica)} answered"
    answers = set().union(*by_replica.values())
    assert len(answers) == 1, f"one seed, {len(answers)} different answers: {by_replica}"


def test_metrics_are_summed_over_the_replicas(client, cluster):
    """Counted exactly, whatever ran before: this test's own searches move the summed counters by their number."""
    cluster.wait_idle()
    before = cluster.metrics()
    with ThreadPoolExecutor(6) as pool:  # concurrent: both replicas' counters are in the sum
        list(pool.map(lambda seed: client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, seed=seed,
            extra_body={"search": FAST}), range(6)))
    text = cluster.metrics()
    health = cluster.health()
    assert metric(text, "specscale_kv_blocks_total") == health["kv_blocks_total"]
    assert metric(text, "specscale_engine_healthy") == REPLICAS
    assert metric(text, 'specscale_replicas{state="reporting"}') == REPLICAS
    for series in ('specscale_searches_total{preset="specscale",outcome="ok"}',
                   'specscale_http_responses_total{route="/v1/chat/completions",status="200"}',
                   'specscale_request_latency_seconds_count{preset="specscale"}'):
        assert metric(text, series) - metric(before, series) == 6, series
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(families) == len(set(families)), "a metric family is split"


def _request_counts(text: str) -> dict:
    pattern = r'^specscale_requests_total\{route="([^"]*)",outcome="(\w+)",status="(\d+)",reason="([^"]*)"\} (\S+)$'
    return {tuple(match[:-1]): float(match[-1]) for match in re.findall(pattern, text, re.MULTILINE)}


def test_every_request_is_counted_once_by_how_it_ended_as_its_client_saw_it(client, cluster):
    """`specscale_requests_total` on the Ray layout equals the client's own count, route by route and reason
    by reason: answers (whole and streamed), 4xx from the ingress (its body checks) and from a replica
    (the search's), and a stream whose client went away. The benchmark that relies on it: benchmarks/soak.py."""
    chat, text_route = "/v1/chat/completions", "/v1/completions"
    cluster.wait_idle()
    before = _request_counts(cluster.metrics())
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=16,
                                   seed=1, extra_body={"search": FAST})
    list(client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=16, seed=2, stream=True,
                                   extra_body={"search": FAST}))
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=60) as h:
        assert h.post(chat, content=b"{").status_code == 400  # the ingress's body check
        assert h.post(chat, json=chat_body({"preset": "greedy"})).status_code == 400  # a replica's search check
        with h.stream("POST", chat, json=chat_body(LONG, stream=True, **LONG_SAMPLING)) as stream:
            for line in stream.iter_lines():
                if "search_progress" in line:
                    break  # the client goes away mid-stream
    expected = {(chat, "completed", "200", ""): 1, (text_route, "completed", "200", ""): 1,
                (chat, "refused", "400", "invalid_json"): 1, (chat, "refused", "400", "unknown_preset"): 1,
                (chat, "cancelled", "499", "client_closed"): 1}
    deadline = time.monotonic() + 30  # the cancelled stream is counted once the ingress has seen it end
    while True:
        after = _request_counts(cluster.metrics())
        delta = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
        if delta == expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert delta == expected


# ---- cancellation, limits ------------------------------------------------------------------------------
def test_disconnect_mid_stream_frees_kv_on_the_serving_replica(cluster):
    before = cluster.metrics()
    body = chat_body(LONG, stream=True, **LONG_SAMPLING)
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=60) as h, \
            h.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        replica_id = response.headers[REPLICA_HEADER]
        lines = response.iter_lines()  # held: a dropped iterator would close the response (a disconnect)
        for line in lines:
            if "search_progress" in line:
                break
        running = cluster.replica(replica_id)
        assert running["requests_running"] == 1 and running["kv_blocks_used"] > 0
    deadline = time.monotonic() + 20
    while (metric(cluster.metrics(), 'specscale_requests_cancelled_total{reason="disconnect"}')
           == metric(before, 'specscale_requests_cancelled_total{reason="disconnect"}')):
        assert time.monotonic() < deadline, "the disconnect did not cancel the search"
        time.sleep(0.05)
    after = cluster.replica(replica_id)
    assert after["kv_blocks_used"] == 0 and after["live_sequences"] == 0 and after["requests_running"] == 0
    text = cluster.metrics()
    within_a_tick = metric(text, 'specscale_cancel_delay_ticks_bucket{le="1"}')
    assert within_a_tick - metric(before, 'specscale_cancel_delay_ticks_bucket{le="1"}') == 1
    print(f"disconnect mid-stream on replica {replica_id}: {running['kv_blocks_used']} KV blocks before, 0 after")


def test_disconnect_while_waiting_for_a_whole_answer_cancels_the_search(cluster):
    before = cluster.metrics()
    payload = json.dumps(chat_body(LONG, **LONG_SAMPLING)).encode()
    host, port = cluster.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
        deadline = time.monotonic() + 20
        while cluster.health()["kv_blocks_used"] == 0:  # the search runs on some replica
            assert time.monotonic() < deadline, "the search never started"
            time.sleep(0.02)
    while (metric(cluster.metrics(), 'specscale_requests_cancelled_total{reason="disconnect"}')
           == metric(before, 'specscale_requests_cancelled_total{reason="disconnect"}')):
        assert time.monotonic() < deadline + 20, "the disconnect did not cancel the search"
        time.sleep(0.05)
    assert cluster.wait_idle()["live_sequences"] == 0


def test_bad_input_and_a_missing_key_get_their_4xx_from_the_ingress_or_the_replica(cluster):
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=60) as h:
        cases = [  # (path, body, status, param): checked at the ingress (schema) or on a replica (search)
            ("/v1/chat/completions", chat_body(temperature=5), 400, "temperature"),
            ("/v1/chat/completions", chat_body({"preset": "greedy"}), 400, "search.preset"),
            ("/v1/chat/completions", chat_body(model="other"), 404, "model"),
            ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
        ]
        for path, body, status, param in cases:
            response = h.post(path, json=body)
            assert response.status_code == status and response.json()["error"]["param"] == param, response.text
        assert h.post("/v1/chat/completions", content=b"{").json()["error"]["code"] == "invalid_json"
        unauthorized = httpx.post(f"{cluster.url}/v1/chat/completions", json=chat_body(), timeout=60)
        assert unauthorized.status_code == 401 and unauthorized.json()["error"]["code"] == "invalid_api_key"
        assert h.get("/v1/nothing").status_code == 404
        text = h.post("/v1/completions", json={"model": MODEL, "prompt": QUESTION, "max_tokens": 16,
                                                "search": FAST}).json()
        assert text["object"] == "text_completion" and text["choices"][0]["text"]


def test_overload_answers_429_with_retry_after_and_nothing_hangs(cluster):
    async def one(h: httpx.AsyncClient):
        response = await h.post("/v1/chat/completions", json=chat_body({"beam_size": 8, "beam_width": 2}))
        return response.status_code, response.headers.get("retry-after"), response.json()

    async def flood():
        async with httpx.AsyncClient(base_url=cluster.url, headers=AUTH, timeout=120,
                                     limits=httpx.Limits(max_connections=200)) as h:
            return await asyncio.wait_for(asyncio.gather(*(one(h) for _ in range(80))), timeout=150)

    results = asyncio.run(flood())
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    capacity = REPLICAS * (MAX_CONCURRENCY + MAX_WAITING)
    assert statuses.count(200) >= capacity and statuses.count(429) > 0
    for status, retry_after, body in results:
        if status == 429:
            assert retry_after is not None and int(retry_after) >= 1
            assert body["error"]["type"] == "overloaded_error"
    assert cluster.wait_idle()["kv_blocks_used"] == 0


def test_a_search_past_its_time_budget_answers_504(client, cluster):
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], seed=1,
                                       extra_body={"search": dict(LONG, timeout_s=0.05)}, **LONG_SAMPLING)
    assert caught.value.status_code == 504 and caught.value.body["code"] == "timeout"
    cluster.wait_idle()


# ---- failures (last: it replaces a replica) ---------------------------------------------------------------
def test_a_replica_killed_mid_load_loses_no_request_and_comes_back(client, cluster):
    """Every search is seeded, so every one whose replica dies is re-run on the other one: all answer 200
    (streamed or not) with the same answer as a fresh search of that seed, and at least one was re-run."""
    seeds = range(8)  # even seeds streamed, odd ones not

    def complete(seed: int):
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": QUESTION}], seed=seed, max_tokens=32,
                stream=seed % 2 == 0,
                extra_body={"search": {"preset": "beam", "beam_size": 16, "beam_width": 4, "max_rounds": 8}})
            return 200, _answer_text(raw.parse())
        except openai.APIStatusError as error:
            return error.status_code, error.body

    cluster.wait_idle()
    before = cluster.metrics()
    original = {r["replica_id"]: r["pid"] for r in cluster.health()["replicas"]}
    with ThreadPoolExecutor(len(seeds)) as pool:
        futures = [pool.submit(complete, seed) for seed in seeds]
        victim = _a_busy_replica(cluster)
        os.kill(original[victim], signal.SIGKILL)
        results = [f.result(timeout=120) for f in futures]  # none hangs
    assert [status for status, _ in results] == [200] * len(seeds), results
    text = cluster.metrics()
    retried = metric(text, 'specscale_request_retries_total{outcome="retried"}') - metric(
        before, 'specscale_request_retries_total{outcome="retried"}')
    assert retried >= 1 and metric(text, 'specscale_request_retries_total{outcome="not_retried"}') == metric(
        before, 'specscale_request_retries_total{outcome="not_retried"}')
    assert metric(text, "specscale_replica_failures_total") > metric(before, "specscale_replica_failures_total")
    for seed, (_, answer) in zip(seeds, results, strict=True):  # a re-run seeded search is the same search
        assert complete(seed) == (200, answer), f"seed {seed}"
    _wait_for_replacement(cluster, set(original), victim)
    print(f"replica {victim} killed under {len(seeds)} requests: all 200, {retried:g} re-run")


def _answer_text(response) -> str:
    """The best path's text, from a completion or from a stream's chunks (whose deltas must carry it
    exactly once, also across a retry)."""
    if isinstance(response, openai.types.chat.ChatCompletion):
        return response.choices[0].message.content
    chunks = list(response)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == 0)


def _a_busy_replica(cluster: Cluster, grace_s: float = 0.5) -> str:
    """A replica with searches running: one seen while both are busy, or else (the router may send the whole
    load to one replica) the busiest once load has been running for `grace_s`; either way its searches must be
    re-run on the other replica."""
    deadline, first_busy = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        busy = sorted((r for r in cluster.health()["replicas"] if r["requests_running"] > 0),
                      key=lambda r: -r["requests_running"])
        first_busy = first_busy or (time.monotonic() if busy else None)
        if len(busy) == REPLICAS or (busy and time.monotonic() - first_busy > grace_s):
            return busy[0]["replica_id"]
        time.sleep(0.02)
    raise AssertionError(f"the load never reached a replica: {cluster.health()}")


def _wait_for_replacement(cluster: Cluster, original: set[str], victim: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        health = cluster.health()
        ids = {r["replica_id"] for r in health["replicas"]}
        if health["replicas_healthy"] == REPLICAS and victim not in ids:
            assert len(ids - original) == 1
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"Ray Serve did not replace replica {victim}: {cluster.health()}")
    replaced = (ids - original).pop()
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=60) as h:  # the router sends the new replica work
        served = {h.post("/v1/chat/completions", json=chat_body()).headers[REPLICA_HEADER] for _ in range(12)}
    assert replaced in served, f"the new replica {replaced} got no request: {served}"
