"""`/health` of `specscale serve --ray` answers 503 "starting" until every deployment of the layout has had all
its replicas running at once, saying what it waits for (what a replica reserves, what the cluster has free);
after that a replica short is one lost: "degraded" with 200 while some serve (issue 45). No Ray is started:
the ingress polls stand-in deployment handles."""

from __future__ import annotations

import asyncio
import json

import pytest

from specscale.scaleout import ingress as ingress_module
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.ingress import Ingress
from specscale.scaleout.layout_start import DeploymentCount, LayoutStart, waiting_for
from specscale.scaleout.replica import ReplicaStatus

HEALTH = {"status": "ok", "error": None, "requests_running": 0, "requests_waiting": 0, "kv_blocks_used": 0,
          "kv_blocks_total": 64, "prm_kv_blocks_used": 0, "live_sequences": 0, "ticks": 0}
DISAGGREGATED = ScaleOutConfig(replicas=2, replica_cpus=1.0, verifier_replicas=1, verifier_cpus=2.0)


class Broadcast:
    def __init__(self, results: list):
        self.results = results

    async def results_async(self, timeout_s: float, return_exceptions: bool) -> list:
        return self.results


class StandInDeployment:
    """A deployment handle whose `broadcast` reaches the replicas `running` holds now."""

    def __init__(self, name: str):
        self.name = name
        self.running = 0

    def broadcast(self, method: str, *args) -> Broadcast:
        return Broadcast([ReplicaStatus(f"{self.name}-{i}", i, "node", 0.0, dict(HEALTH), "") for i in range(self.running)])


def stand_in_ingress(config: ScaleOutConfig) -> tuple:
    """The ingress class as it is written, without the Ray Serve replica wrapper `@serve.ingress` puts around it
    (the wrapper's first base)."""
    replicas, verifiers = StandInDeployment("search"), StandInDeployment("prm")
    return Ingress.__mro__[1](config, replicas, verifiers), replicas, verifiers


def health(ingress) -> tuple[int, dict]:
    response = asyncio.run(ingress.health())
    return response.status_code, json.loads(response.body)


@pytest.fixture(autouse=True)
def cluster_with_no_free_cpu(monkeypatch):
    async def resources():
        return {"CPU": 0.0}, {"CPU": 2.0}

    monkeypatch.setattr(ingress_module, "cluster_resources", resources)


def test_a_half_deployed_disaggregated_layout_is_starting_and_says_what_it_waits_for():
    ingress, replicas, verifiers = stand_in_ingress(DISAGGREGATED)
    replicas.running = 2  # the search replicas are up, the PRM replica is not scheduled yet
    status, body = health(ingress)
    assert (status, body["status"]) == (503, "starting")
    assert body["waiting_for"] == ["1 of 1 PRM replicas not running yet; each reserves 2 CPUs; "
                                   "the cluster has 0 of 2 CPUs free"]
    verifiers.running = 1
    status, body = health(ingress)
    assert (status, body["status"]) == (200, "ok") and "waiting_for" not in body


def test_a_replica_lost_after_the_layout_was_up_is_degraded_not_starting():
    ingress, replicas, verifiers = stand_in_ingress(DISAGGREGATED)
    replicas.running, verifiers.running = 2, 1
    assert health(ingress)[0] == 200
    replicas.running = 1
    status, body = health(ingress)
    assert (status, body["status"], body["replicas_healthy"]) == (200, "degraded", 1)
    replicas.running = 0
    assert health(ingress)[1]["status"] == "failed"


def test_a_colocated_layout_starts_when_all_its_replicas_run():
    ingress, replicas, _ = stand_in_ingress(ScaleOutConfig(replicas=2, replica_cpus=1.0))
    replicas.running = 1
    status, body = health(ingress)
    assert (status, body["status"]) == (503, "starting") and body["waiting_for"][0].startswith("1 of 2 search")
    replicas.running = 2
    assert health(ingress)[1]["status"] == "ok"


def test_the_start_is_remembered_and_waiting_lines_name_each_reserved_resource():
    start = LayoutStart()
    short = [DeploymentCount("PRM replicas", 0, 1, {"CPU": 1.0, "GPU": 0.5})]
    assert not start.observe(short)
    assert start.observe([DeploymentCount("PRM replicas", 1, 1, {})]) and start.observe(short)
    assert waiting_for(short, {"CPU": 3.0}, {"CPU": 4.0, "GPU": 1.0}) == [
        "1 of 1 PRM replicas not running yet; each reserves 1 CPUs, 0.5 GPUs; the cluster has 3 of 4 CPUs free, "
        "0 of 1 GPUs free"]
    assert "resources unknown" in waiting_for(short, {}, {})[0]
