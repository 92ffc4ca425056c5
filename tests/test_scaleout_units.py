"""The parts of `specscale serve --ray` that need no Ray instance: summing the replicas' Prometheus
expositions, the ingress's own counters, the scale-out config and the `serve --ray` flags."""

from __future__ import annotations

import pytest

from specscale.cli import build_parser
from specscale.pipeline import PipelineConfig
from specscale.scaleout.cluster_counters import ClusterCounters
from specscale.scaleout.command import scale_out_config
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.exposition import only_families, sum_expositions
from specscale.server.command import pipeline_config, server_settings
from specscale.server.engine_loop import EngineSnapshot
from specscale.server.metrics import ServerMetrics
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
