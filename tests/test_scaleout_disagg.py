"""Disaggregated `specscale serve --ray --verifier-replicas V` on a local Ray instance started by the test
(`ray.init(num_cpus=2)`): two generator replicas and one PRM replica as separate Ray Serve deployments
(tiny random checkpoints, one torch thread each), and beside them, in the same Ray instance, a co-located
application (one replica holding both models) at `/colocated` as the reference.

Covered: the official `openai` client gets answers, streamed and not, from both generator replicas; the
same seed gives the same answer (text and PRM scores) as co-located serving; the PRM replica's batches
hold steps of both generator replicas' searches (`specscale_prm_batches_total{generator_replicas="2"}`)
and every generator PRM batch was one call to it; /health lists the PRM replica apart; a client that
disconnects mid-stream has its search cancelled and its KV freed, and a search past its budget gets 504,
as co-located; a PRM replica
killed under load is replaced and every request answers 200 (its scoring calls re-sent until the new PRM
replica answers) with its seed's paths, none hangs; every replica process is gone once Ray is shut down.
No test relies on what ran before it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import openai
import pytest
import ray
from ray import serve

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from specscale.pipeline import PipelineConfig
from specscale.scaleout.application import build_application
from specscale.scaleout.command import free_port
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.ingress import REPLICA_HEADER
from specscale.server.settings import ServerSettings

MODEL = "tiny"
GENERATORS, MAX_CONCURRENCY, MAX_WAITING = 2, 2, 2
QUESTION = "Tom has 12 apples. He buys 7 more. How many apples does Tom have?"
FAST = {"beam_size": 4, "beam_width": 2, "max_rounds": 3}  # a few 16-token steps: well under a second
LONG = {"preset": "beam", "beam_size": 64, "beam_width": 4, "max_rounds": 40}  # about a second: time to cancel
LONG_SAMPLING = {"max_tokens": 64, "temperature": 1.2}
COLOCATED = "/colocated"


@dataclass
class Deployments:
    url: str
    pids: set[int] = field(default_factory=set)  # every replica process seen, checked gone at the end

    def health(self, prefix: str = "") -> dict:
        health = httpx.get(f"{self.url}{prefix}/health", timeout=30).json()
        self.pids.update(r["pid"] for r in health["replicas"] + health.get("verifier_replicas", []))
        return health

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text

    def client(self, prefix: str = "") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}{prefix}/v1", api_key="none", max_retries=0, timeout=90)


def _config(generator, prm, replicas: int, verifier_replicas: int) -> ScaleOutConfig:
    return ScaleOutConfig(
        PipelineConfig(generator=str(generator), prm=str(prm), generator_kv_gb=0.1, prm_kv_gb=0.1,
                       max_concurrency=MAX_CONCURRENCY, lv_threshold_tokens=256),
        ServerSettings(served_model_name=MODEL, max_waiting=MAX_WAITING, max_beam_size=64, request_timeout_s=60),
        replicas=replicas, replica_cpus=0.5, threads=1, health_check_period_s=1.0,
        verifier_replicas=verifier_replicas, verifier_cpus=0.5, verifier_batch_wait_s=0.05, verifier_timeout_s=30,
    )


@pytest.fixture(scope="module")
def deployments(tmp_path_factory):
    generator = build_stepping_generator(tmp_path_factory.mktemp("gen"), eos_rate=0.0)
    prm = build_qwen_prm_checkpoint(tmp_path_factory.mktemp("prm"))
    port = free_port("127.0.0.1")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    found = Deployments(f"http://127.0.0.1:{port}")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        logging_config = {"log_level": "WARNING", "enable_access_log": False}
        serve.run(build_application(_config(generator, prm, GENERATORS, 1)), name="disaggregated", route_prefix="/",
                  logging_config=logging_config)
        serve.run(build_application(_config(generator, prm, 1, 0)), name="colocated", route_prefix=COLOCATED,
                  logging_config=logging_config)
        found.health()
        found.health(COLOCATED)
        yield found
    finally:
        serve.shutdown()
        ray.shutdown()
    _assert_gone(found.pids)


def _assert_gone(pids: set[int], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = {pid for pid in pids if _alive(pid)}
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"replica processes still running after ray.shutdown(): {sorted(alive)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone, only not reaped yet
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def metric(text: str, series: str) -> float:
    """The value of one series ('name' or 'name{labels}') in a Prometheus exposition (0 if absent)."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _paths(client: openai.OpenAI, seed: int, max_tokens: int = 16, search: dict = FAST) -> tuple[str, str]:
    """(answering replica, the paths' texts and scores as JSON) of one seeded search."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=max_tokens, seed=seed, n=2,
        extra_body={"search": search})
    completion = raw.parse()
    paths = [(c.message.content, (c.model_extra or {})["score"]) for c in completion.choices]
    return raw.headers[REPLICA_HEADER], json.dumps(paths)


def same_paths(a: str, b: str) -> bool:
    """The same path texts in the same order, with scores equal up to float rounding: the PRM scores a path
    in whatever batch it lands in, and the test PRM's fp32 GEMMs round by the batch's shape (~1e-7 seen)."""
    a_paths, b_paths = json.loads(a), json.loads(b)
    return ([text for text, _ in a_paths] == [text for text, _ in b_paths]
            and all(abs(x - y) <= 1e-5 for (_, x), (_, y) in zip(a_paths, b_paths, strict=True)))


# ---- the API, and where the PRM runs -----------------------------------------------------------------------
def test_health_lists_the_generator_replicas_and_the_prm_replica_apart(deployments):
    health = deployments.health()
    assert health["status"] == "ok" and health["replicas_healthy"] == GENERATORS
    assert health["verifier_replicas_target"] == 1 and health["verifier_replicas_healthy"] == 1
    (prm,) = health["verifier_replicas"]
    assert prm["prm_kv_blocks_total"] > 0 and "prm" in prm["memory"]
    assert all("prm" not in r["memory"] for r in health["replicas"]), "a generator replica loaded the PRM"
    assert "verifier_replicas" not in deployments.health(COLOCATED)


def test_both_generator_replicas_answer_through_the_openai_client_streamed_and_not(deployments):
    client = deployments.client()

    def stream(seed: int):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=16, seed=seed, stream=True,
            extra_body={"search": FAST})
        chunks = list(raw.parse())
        assert any("search_progress" in (c.model_extra or {}) for c in chunks)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return raw.headers[REPLICA_HEADER]

    per_kind = GENERATORS * (MAX_CONCURRENCY + MAX_WAITING) // 2
    with ThreadPoolExecutor(2 * per_kind) as pool:
        answers = [pool.submit(_paths, client, seed) for seed in range(per_kind)]
        streams = [pool.submit(stream, seed) for seed in range(per_kind)]
        served_by = {f.result()[0] for f in answers} | {f.result() for f in streams}
    assert len(served_by) == GENERATORS, f"one generator replica served everything: {served_by}"


def test_the_same_seed_gives_the_same_answer_as_colocated_serving(deployments):
    colocated, disaggregated = deployments.client(COLOCATED), deployments.client()
    with ThreadPoolExecutor(6) as pool:  # concurrent: the PRM batches mix searches (and generator replicas)
        here = list(pool.map(lambda seed: _paths(disaggregated, seed), [11, 12, 13] * 2))
        reference = list(pool.map(lambda seed: _paths(colocated, seed), [11, 12, 13]))
    assert all(same_paths(paths, expected) for (_, paths), (_, expected) in zip(here, reference * 2, strict=True))


def test_prm_batches_merge_steps_of_both_generator_replicas(deployments):
    before = deployments.metrics()
    client = deployments.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda seed: _paths(client, seed), range(20, 28)))
    text = deployments.metrics()
    merged = metric(text, 'specscale_prm_batches_total{generator_replicas="2"}')
    assert merged > metric(before, 'specscale_prm_batches_total{generator_replicas="2"}'), text
    # every PRM batch a generator replica's runtime released was one call to the PRM replica
    calls, batches = "specscale_prm_calls_total", "specscale_verifier_batch_size_count"
    assert metric(text, calls) - metric(before, calls) == metric(text, batches) - metric(before, batches) > 0
    assert metric(text, 'specscale_verifier_replicas{state="reporting"}') == 1
    solo = metric(text, 'specscale_prm_batches_total{generator_replicas="1"}')
    print(f"PRM batches: {merged:g} with both generator replicas' steps, {solo:g} with one replica's")


# ---- the contract: cancel and time budget, with the PRM elsewhere ------------------------------------------
def test_disconnect_mid_stream_frees_kv_on_the_generator_replica_and_504_past_the_budget(deployments):
    before = deployments.metrics()
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "seed": 3, "stream": True,
            "search": LONG, **LONG_SAMPLING}
    with httpx.Client(base_url=deployments.url, timeout=60) as h, \
            h.stream("POST", "/v1/chat/completions", json=body) as response:
        replica_id = response.headers[REPLICA_HEADER]
        lines = response.iter_lines()  # held: a dropped iterator would close the response (a disconnect)
        next(line for line in lines if "search_progress" in line)
    series = 'specscale_requests_cancelled_total{reason="disconnect"}'
    _wait_for(lambda: metric(deployments.metrics(), series) > metric(before, series), "the search was not cancelled")
    replica = next(r for r in deployments.health()["replicas"] if r["replica_id"] == replica_id)
    assert replica["kv_blocks_used"] == 0 and replica["live_sequences"] == 0 and replica["requests_running"] == 0

    with pytest.raises(openai.APIStatusError) as caught:
        deployments.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": QUESTION}], seed=1,
            extra_body={"search": dict(LONG, timeout_s=0.05)}, **LONG_SAMPLING)
    assert caught.value.status_code == 504 and caught.value.body["code"] == "timeout"


# ---- failures (last: it replaces the PRM replica) -----------------------------------------------------------
# searches long enough (several rounds of 16 candidates) that some are still running when the PRM replica dies,
# on a fast CPU too
KILL_LOAD = {"preset": "beam", "beam_size": 16, "beam_width": 4, "max_rounds": 8}


def test_a_prm_replica_killed_under_load_is_replaced_and_no_request_hangs(deployments):
    """Searches in flight when the PRM replica dies still need scores: their scoring calls are re-sent until
    Ray Serve's new PRM replica answers, so every one answers 200, with the paths of a fresh search of its seed."""
    (prm,) = deployments.health()["verifier_replicas"]
    client = deployments.client()
    seeds = range(40, 46)

    def complete(seed: int):
        try:
            return 200, _paths(client, seed, max_tokens=32, search=KILL_LOAD)[1]
        except openai.APIStatusError as error:
            return error.status_code, error.body

    before = deployments.metrics()
    with ThreadPoolExecutor(len(seeds)) as pool:
        futures = [pool.submit(complete, seed) for seed in seeds]
        calls = "specscale_prm_calls_total"
        _wait_for(lambda: metric(deployments.metrics(), calls) > metric(before, calls), "no PRM call under load",
                  poll_s=0.02)
        os.kill(prm["pid"], signal.SIGKILL)
        in_flight = sum(not f.done() for f in futures)
        results = [f.result(timeout=150) for f in futures]  # none hangs
    assert in_flight >= 1, "every search had finished before the PRM replica was killed"
    assert [status for status, _ in results] == [200] * len(seeds), results
    _wait_for(lambda: _prm_replaced(deployments, prm["replica_id"]), "Ray Serve did not replace the PRM replica")
    for seed, (_, answer) in zip(seeds, results, strict=True):  # a re-sent scoring call changes no answer
        again_status, again = complete(seed)
        assert again_status == 200 and same_paths(again, answer), f"seed {seed}"
    text = deployments.metrics()
    retries = metric(text, "specscale_prm_call_retries_total")  # only the generator replicas that survived
    print(f"PRM replica killed under {len(seeds)} requests ({in_flight} in flight): all 200, {retries:g} scoring "
          f"calls re-sent")


def _prm_replaced(deployments: Deployments, victim: str) -> bool:
    health = deployments.health()
    ids = [v["replica_id"] for v in health["verifier_replicas"]]
    return health["status"] == "ok" and len(ids) == 1 and victim not in ids


def _wait_for(condition, message: str, timeout_s: float = 120.0, poll_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(poll_s)
