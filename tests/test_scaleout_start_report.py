"""`specscale serve --ray` says what its layout waits for while it comes up (issue 45): Ray Serve's `serve.run`
waits without a word while a layout cannot be scheduled (the disaggregated layout on 2 cores). At once, a layout
that reserves more than the cluster has in all; from 10 s on, each change of what it still waits for. No Ray is
started: `serve.status()` and the resources are stand-ins."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.layout_start import StartReport, layout_deployments, running_replicas, shortfall

DISAGGREGATED_ON_2_CORES = ScaleOutConfig(replicas=2, replica_cpus=1.0, verifier_replicas=1, verifier_cpus=1.0)
TWO_CORES = {"CPU": 2.0}


class ReplicaState(Enum):  # Ray Serve's, as serve.status() names them
    STARTING = "STARTING"
    RUNNING = "RUNNING"


@dataclass
class Deployment:
    replica_states: dict


@dataclass
class Application:
    deployments: dict


@dataclass
class ServeStatus:
    applications: dict


def test_a_layout_larger_than_the_cluster_is_said_at_once():
    lines = shortfall(layout_deployments(DISAGGREGATED_ON_2_CORES), TWO_CORES)
    assert lines == ["the layout reserves 3 CPUs (2 search replicas x 1 + 1 PRM replicas x 1); the Ray cluster "
                     "has 2 CPUs in all: Ray waits for a node with more to join (or lower --replicas, "
                     "--replica-cpus, --verifier-cpus)"]
    gpus = ScaleOutConfig(replicas=2, replica_cpus=0.5, replica_gpus=1.0)
    assert shortfall(layout_deployments(gpus), {"CPU": 16.0, "GPU": 1.0}) == [
        "the layout reserves 2 GPUs (2 search replicas x 1); the Ray cluster has 1 GPUs in all: Ray waits for a "
        "node with more to join (or lower --replicas, --replica-gpus, --verifier-gpus)"]


def test_a_layout_that_fits_or_an_unknown_cluster_says_nothing():
    assert shortfall(layout_deployments(ScaleOutConfig(replicas=2, replica_cpus=1.0)), TWO_CORES) == []
    assert shortfall(layout_deployments(DISAGGREGATED_ON_2_CORES), {}) == []


def test_running_replicas_are_read_off_serve_status():
    status = ServeStatus({"specscale": Application({
        "SearchReplica": Deployment({ReplicaState.RUNNING: 2}),
        "VerifierReplica": Deployment({ReplicaState.STARTING: 1}),
        "Ingress": Deployment({ReplicaState.RUNNING: 1})})})
    assert running_replicas(status, "specscale") == {"SearchReplica": 2, "VerifierReplica": 0, "Ingress": 1}
    assert running_replicas(ServeStatus({}), "specscale") == {}  # not deployed yet


def test_the_start_report_says_what_the_layout_waits_for_when_it_changes():
    lines: list[str] = []
    report = StartReport(DISAGGREGATED_ON_2_CORES, lines.append, first_after_s=10.0)
    report.before_deploying(TWO_CORES)
    assert len(lines) == 1 and lines[0].startswith("the layout reserves 3 CPUs")
    report.poll(5.0, {}, TWO_CORES, TWO_CORES)  # a start of a few seconds says nothing more
    assert len(lines) == 1
    report.poll(10.0, {"SearchReplica": 0}, {"CPU": 0.0}, TWO_CORES)
    assert lines[1] == ("waiting for the layout after 10 s: 2 of 2 search replicas not running yet; each reserves "
                        "1 CPUs; the cluster has 0 of 2 CPUs free; 1 of 1 PRM replicas not running yet; each "
                        "reserves 1 CPUs; the cluster has 0 of 2 CPUs free")
    report.poll(15.0, {"SearchReplica": 0}, {"CPU": 0.0}, TWO_CORES)  # no change: no line
    report.poll(20.0, {"SearchReplica": 2}, {"CPU": 0.0}, TWO_CORES)
    assert len(lines) == 3
    assert lines[2] == ("waiting for the layout after 20 s: 1 of 1 PRM replicas not running yet; each reserves "
                        "1 CPUs; the cluster has 0 of 2 CPUs free")
    report.poll(25.0, {"SearchReplica": 2, "VerifierReplica": 1}, {"CPU": 0.0}, TWO_CORES)  # up: nothing to say
    assert len(lines) == 3
