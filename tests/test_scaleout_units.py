"""The parts of `specscale serve --ray` that need no Ray instance: summing the replicas' Prometheus
expositions, the ingress's own counters, the scale-out config, the `serve --ray` flags, and the ingress's
retry / replay logic (`ForwardedSearch`) driven by a scripted stand-in for the replicas' handle."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import BackPressureError

from specscale.cli import build_parser
from specscale.pipeline import PipelineConfig
from specscale.scaleout.cluster_counters import ClusterCounters
from specscale.scaleout.command import scale_out_config
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.exposition import only_families, sum_expositions
from specscale.scaleout.forwarding import RETRIES, ForwardedSearch
from specscale.scaleout.messages import Answered, Rejected, StreamOpened
from specscale.serve import pipeline_config, server_settings
from specscale.server.engine_loop import EngineSnapshot
from specscale.server.errors import APIError
from specscale.server.metrics import ServerMetrics
from specscale.server.protocol import ChatCompletionRequest
from specscale.server.settings import ServerSettings


def _replica_metrics(preset: str, latency_s: float, kv_used: int) -> str:
    metrics = ServerMetrics(clock=lambda: 100.0)
    metrics.request_latency(preset, latency_s)
    metrics.response("/v1/chat/completions", 200)
    metrics.cancellation("disconnect", 0)
    return metrics.render(EngineSnapshot(ticks=10, running=1, kv_blocks_used=kv_used, kv_blocks_total=50))


def test_summed_expositions_add_every_sample_and_keep_each_family_together():
    one = _replica_metrics("beam", 0.2, kv_used=3)
    two = _replica_metrics("specscale", 3.0, kv_used=4)
    total = sum_expositions([one, two])
    lines = total.splitlines()
    assert "specscale_kv_blocks_used 7" in lines and "specscale_kv_blocks_total 100" in lines
    assert "specscale_engine_ticks_total 20" in lines and "specscale_engine_healthy 2" in lines
    assert 'specscale_requests_cancelled_total{reason="disconnect"} 2' in lines
    assert 'specscale_http_responses_total{route="/v1/chat/completions",status="200"} 2' in lines
    # each replica saw a different preset: both series sit under the one family header
    families = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(families) == len(set(families))
    start = lines.index("# TYPE specscale_request_latency_seconds histogram")
    block = lines[start + 1:]
    block = block[:next(i for i, line in enumerate(block) if line.startswith("#"))]
    assert {line.split("{")[0] for line in block} == {"specscale_request_latency_seconds_bucket",
                                                      "specscale_request_latency_seconds_sum",
                                                      "specscale_request_latency_seconds_count"}
    assert 'specscale_request_latency_seconds_count{preset="beam"} 1' in block
    assert 'specscale_request_latency_seconds_count{preset="specscale"} 1' in block


def test_only_families_keeps_the_named_families_whole():
    text = _replica_metrics("beam", 0.2, kv_used=3)
    kept = only_families(text, {"specscale_http_responses_total"}).splitlines()
    assert kept[0].startswith("# HELP specscale_http_responses_total") and len(kept) == 3
    assert kept[2] == 'specscale_http_responses_total{route="/v1/chat/completions",status="200"} 1'


def test_cluster_counters_count_failures_retries_and_replicas_seen():
    counters = ClusterCounters()
    counters.saw_replicas(["a", "b"])
    counters.replica_lost()
    counters.retry("retried")
    counters.saw_replicas(["a", "c"])  # Ray replaced b with c
    lines = counters.render(replicas_reporting=2, replicas_target=2).splitlines()
    assert "specscale_replicas_seen_total 3" in lines and "specscale_replica_failures_total 1" in lines
    assert 'specscale_request_retries_total{outcome="retried"} 1' in lines
    assert 'specscale_replicas{state="reporting"} 2' in lines


def test_scale_out_config_sizes_each_replica_and_the_ingress_queue():
    config = ScaleOutConfig(PipelineConfig(max_concurrency=8), ServerSettings(max_waiting=4), replicas=3,
                            replica_cpus=2.5)
    assert config.replica_capacity == 12 and config.ingress_queue == 36 and config.torch_threads == 2
    assert ScaleOutConfig(replica_cpus=0.5).torch_threads == 1
    assert ScaleOutConfig(router_queue=5).ingress_queue == 5
    with pytest.raises(ValueError, match="replicas"):
        ScaleOutConfig(replicas=0)


def test_serve_ray_flags_build_a_config_with_absolute_checkpoint_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["serve", "--ray", "--replicas", "3", "--replica-cpus", "2",
                                      "--replica-gpus", "0.5", "--generator", "gen", "--prm", "prm",
                                      "--max-concurrency", "4", "--max-waiting", "2"])
    config = scale_out_config(args, pipeline_config(args), server_settings(args))
    assert args.ray and config.replicas == 3 and config.replica_cpus == 2 and config.replica_gpus == 0.5
    assert config.pipeline.generator == str(tmp_path / "gen") and config.pipeline.prm == str(tmp_path / "prm")
    assert config.replica_capacity == 6


# ---- ForwardedSearch against a scripted handle: the retry and replay logic, exactly ---------------------
class ScriptedCall:
    """A replica's streaming call: yields its items, then raises `failure` (if any) where the script says."""

    def __init__(self, items: list, failure: BaseException | None = None):
        self.items = list(items)
        self.failure = failure
        self.cancelled = False

    async def __anext__(self):
        if self.items:
            return self.items.pop(0)
        if self.failure is not None:
            raise self.failure
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedReplicas:
    """Stands in for the SearchReplica deployment handle: each `search.remote` takes the next scripted call."""

    def __init__(self, calls: list[ScriptedCall]):
        self.calls = calls
        self.sent = 0
        self.search = self

    def options(self, stream: bool):
        return self

    def remote(self, body, chat, request_id):
        self.sent += 1
        return self.calls.pop(0)


def _forwarded(calls: list[ScriptedCall], seed: int | None = 3):
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "q"}], "seed": seed})
    counters = ClusterCounters()
    replicas = ScriptedReplicas(calls)
    return ForwardedSearch(replicas, body, True, "rid", 10.0, 2, counters), replicas, counters


async def _collect(search) -> tuple:
    first = await search.open()
    chunks = [chunk async for chunk in search.chunks()] if isinstance(first, StreamOpened) else []
    return first, chunks


def _run(coro):
    return asyncio.run(coro)


def test_a_seeded_stream_whose_replica_dies_is_replayed_without_repeating_a_chunk():
    chunks = ["open", "round 0", "round 1", "answer", "data: [DONE]\n\n"]
    dying = ScriptedCall([StreamOpened("a"), *chunks[:3]], ActorDiedError())
    search, replicas, counters = _forwarded([dying, ScriptedCall([StreamOpened("b"), *chunks])])
    first, received = _run(_collect(search))
    assert first == StreamOpened("a") and received == chunks and replicas.sent == 2
    assert counters.replicas_lost == 1 and counters.retries == {"retried": 1}


def test_an_unseeded_stream_that_sent_progress_ends_with_a_503_event_and_a_second_loss_too():
    search, _, counters = _forwarded([ScriptedCall([StreamOpened("a"), "open", "round 0"], ActorDiedError())],
                                     seed=None)
    _, received = _run(_collect(search))
    assert received[:2] == ["open", "round 0"] and received[-1] == "data: [DONE]\n\n"
    assert '"code": "replica_failed"' in received[2] and counters.retries == {"not_retried": 1}

    dying = [ScriptedCall([StreamOpened("a"), "open"], ActorDiedError())]
    dying += [ScriptedCall([StreamOpened("b"), "open", "round 0"], ActorDiedError()) for _ in range(RETRIES)]
    search, replicas, counters = _forwarded(dying)
    _, received = _run(_collect(search))
    assert received[:2] == ["open", "round 0"] and '"code": "replica_failed"' in received[2]
    assert replicas.sent == RETRIES + 1 and counters.retries == {"retried": RETRIES, "not_retried": 1}


def test_a_whole_answer_is_re_run_up_to_its_retries_then_answered_503_and_backpressure_is_a_429():
    engine_failed = Rejected.of(APIError(503, "the engine failed: PRMUnavailable", code="engine_failed"))
    failures = [ScriptedCall([], ActorDiedError()), ScriptedCall([engine_failed]), ScriptedCall([], ActorDiedError())]
    search, replicas, _ = _forwarded([*failures, ScriptedCall([Answered({"id": 1}, "b")])])
    assert _run(search.open()) == Answered({"id": 1}, "b") and replicas.sent == RETRIES + 1 == 4
    assert search.retries == RETRIES

    search, _, counters = _forwarded([ScriptedCall([], ActorDiedError()) for _ in range(RETRIES + 1)])
    lost = _run(search.open())
    assert isinstance(lost, Rejected) and lost.status == 503 and lost.body["error"]["code"] == "replica_failed"
    assert counters.retries == {"retried": RETRIES, "not_retried": 1}

    refused = Rejected.of(APIError(400, "search.preset: unknown", param="search.preset"))
    search, replicas, _ = _forwarded([ScriptedCall([refused])])
    assert _run(search.open()) == refused and replicas.sent == 1  # a client's error is not re-run

    search, _, _ = _forwarded([ScriptedCall([], BackPressureError(9, 8))])
    full = _run(search.open())
    assert full.status == 429 and full.headers == {"Retry-After": "2"}
    search.close()  # nothing left to cancel: a call whose routing failed is not touched again


def test_closing_a_running_search_cancels_its_replica_call():
    running = ScriptedCall([StreamOpened("a"), "open", "round 0", "round 1"])
    search, _, _ = _forwarded([running])
    assert _run(search.open()) == StreamOpened("a")
    search.close()
    assert running.cancelled


# ---- how a forwarded stream ended, as the ingress counts it (`specscale_requests_total`) ---------------------
def test_the_ingress_counts_a_forwarded_stream_by_how_it_ended():
    from specscale.scaleout.ingress import stream_outcome
    from specscale.server.responses import sse

    route = "/v1/chat/completions"
    chunks = ["open", "round 0", "answer", "data: [DONE]\n\n"]
    search, _, _ = _forwarded([ScriptedCall([StreamOpened("a"), *chunks])])
    _run(_collect(search))
    assert tuple(stream_outcome(search, route).labels().values()) == (route, "completed", "200", "")

    timeout = sse(APIError(504, "past its time budget", code="timeout").body())
    search, _, _ = _forwarded([ScriptedCall([StreamOpened("a"), "open", timeout, "data: [DONE]\n\n"])])
    _run(_collect(search))
    assert tuple(stream_outcome(search, route).labels().values()) == (route, "failed", "504", "timeout")

    search, _, _ = _forwarded([ScriptedCall([StreamOpened("a"), "open", "round 0"], ActorDiedError())], seed=None)
    _run(_collect(search))
    assert tuple(stream_outcome(search, route).labels().values()) == (route, "failed", "503", "replica_failed")

    search, _, _ = _forwarded([ScriptedCall([StreamOpened("a"), *chunks])])  # the client left after one chunk

    async def first_chunk_only():
        await search.open()
        async for _ in search.chunks():
            break

    _run(first_chunk_only())
    assert tuple(stream_outcome(search, route).labels().values()) == (route, "cancelled", "499", "client_closed")

    search, _, _ = _forwarded([ScriptedCall([StreamOpened("a"), *chunks])])  # it left once it had read [DONE]

    async def until_done():
        await search.open()
        async for chunk in search.chunks():
            if chunk == "data: [DONE]\n\n":
                break  # the proxy cancels the stream before the replica's call has ended

    _run(until_done())
    assert tuple(stream_outcome(search, route).labels().values()) == (route, "completed", "200", "")


def test_the_ingress_exposes_its_request_counts_beside_the_replicas_series():
    """The replicas count no request outcome (the ingress sees each request's end, re-runs included): the
    ingress's own `specscale_requests_total` is what the cluster's /metrics sums with the replicas' text."""
    from specscale.server.metrics import RequestOutcome

    ingress_metrics = ServerMetrics(clock=lambda: 100.0)
    ingress_metrics.request_outcome(RequestOutcome("/v1/completions", "refused", 400, "invalid_json"))
    ingress_metrics.request_outcome(RequestOutcome("/v1/chat/completions", "completed", 200))
    ingress = only_families(ingress_metrics.render(EngineSnapshot()),
                            {"specscale_http_responses_total", "specscale_requests_total"})
    total = sum_expositions([_replica_metrics("beam", 0.2, kv_used=3), _replica_metrics("beam", 0.1, kv_used=1),
                             ingress])
    assert ('specscale_requests_total{route="/v1/completions",outcome="refused",status="400",'
            'reason="invalid_json"} 1') in total
    assert 'specscale_requests_total{route="/v1/chat/completions",outcome="completed",status="200",reason=""} 1' \
        in total
