"""Whether the Ray layout of `specscale serve --ray` has come up, and what it still waits for.

A deployment short of its replicas before the layout was ever whole is still starting (Ray has not scheduled
or loaded them yet); after every deployment has had all its replicas running at once, one short of them lost a
replica (Serve replaces it). `/health` answers 503 "starting" for the former with `waiting_for`: one line per
deployment short of replicas, with what each replica reserves and what the cluster has free (Ray's resources
API), which says when the layout cannot be scheduled at all. `specscale serve --ray` prints the same while it
waits for its layout to come up (`StartReport`), and at once when the layout reserves more than the cluster has.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

RESOURCES = (("CPU", "CPUs"), ("GPU", "GPUs"))  # Ray's resource name, as a line says it
FLAGS = {"CPU": "--replicas, --replica-cpus, --verifier-cpus", "GPU": "--replicas, --replica-gpus, --verifier-gpus"}


@dataclass(frozen=True)
class DeploymentCount:
    """One deployment's replicas now: `running` answered the ingress's poll, of `target`; each reserves
    `reserves` (Ray resource name -> amount)."""

    name: str
    running: int
    target: int
    reserves: dict[str, float]

    @property
    def missing(self) -> int:
        return max(self.target - self.running, 0)


class LayoutStart:
    """Remembers whether every deployment has had all its replicas running at once."""

    def __init__(self) -> None:
        self.up = False

    def observe(self, deployments: list[DeploymentCount]) -> bool:
        """True from the first poll at which no deployment was short of replicas on."""
        self.up = self.up or all(d.missing == 0 for d in deployments)
        return self.up


def layout_deployments(config, running: dict[str, int] | None = None) -> list[DeploymentCount]:
    """The deployments of the layout `config` (a ScaleOutConfig) describes, with `running` replicas of each
    (by Serve's deployment name; none when not given). The ingress reserves nothing."""
    running = running or {}
    counts = [DeploymentCount("search replicas", running.get("SearchReplica", 0), config.replicas,
                              {"CPU": config.replica_cpus, "GPU": config.replica_gpus})]
    if config.disaggregated:
        counts.append(DeploymentCount("PRM replicas", running.get("VerifierReplica", 0), config.verifier_replicas,
                                      {"CPU": config.verifier_cpus, "GPU": config.verifier_gpus}))
    return counts


def running_replicas(serve_status, app_name: str) -> dict[str, int]:
    """Replicas in state RUNNING per deployment, from Ray Serve's `serve.status()` (empty before the
    application is known)."""
    application = serve_status.applications.get(app_name)
    if application is None:
        return {}
    return {name: sum(count for state, count in deployment.replica_states.items()
                      if getattr(state, "value", state) == "RUNNING")
            for name, deployment in application.deployments.items()}


def shortfall(deployments: list[DeploymentCount], total: dict) -> list[str]:
    """One line per resource the whole layout reserves more of than the cluster has in all: Ray cannot
    schedule it until more nodes join ('the layout reserves 3 CPUs (2 search replicas x 1 + 1 PRM replicas x
    1); the Ray cluster has 2 CPUs in all: ...'). None when Ray did not say what it has (`total` empty)."""
    lines: list[str] = []
    if not total:
        return lines
    for key, name in RESOURCES:
        parts = [(d, d.reserves.get(key, 0)) for d in deployments if d.reserves.get(key, 0) and d.target]
        needed = sum(d.target * each for d, each in parts)
        if needed > total.get(key, 0):
            terms = " + ".join(f"{d.target} {d.name} x {each:g}" for d, each in parts)
            lines.append(f"the layout reserves {needed:g} {name} ({terms}); the Ray cluster has "
                         f"{total.get(key, 0):g} {name} in all: Ray waits for a node with more to join "
                         f"(or lower {FLAGS[key]})")
    return lines


def waiting_for(deployments: list[DeploymentCount], available: dict, total: dict) -> list[str]:
    """One line per deployment short of replicas: how many, what each reserves, what the cluster has free."""
    return [f"{d.missing} of {d.target} {d.name} not running yet; each reserves {reserved_text(d.reserves)}; "
            f"the cluster has {free_text(d.reserves, available, total)}" for d in deployments if d.missing]


def reserved_text(reserves: dict[str, float]) -> str:
    named = [f"{reserves.get(key, 0):g} {name}" for key, name in RESOURCES if reserves.get(key, 0)]
    return ", ".join(named) or "nothing"


def free_text(reserves: dict[str, float], available: dict, total: dict) -> str:
    """'0 of 2 CPUs free' for each resource a replica reserves (CPUs when it reserves none)."""
    keys = [(key, name) for key, name in RESOURCES if reserves.get(key, 0)] or RESOURCES[:1]
    if not total:
        return "resources unknown (Ray's resources API did not answer)"
    return ", ".join(f"{available.get(key, 0):g} of {total.get(key, 0):g} {name} free" for key, name in keys)


class StartReport:
    """What `specscale serve --ray` prints while its layout comes up (Ray Serve's own `serve.run` waits without
    a word, and Ray says only that a replica 'has taken more than 30s to be scheduled'): at once, a layout that
    reserves more than the cluster has in all; then, from `first_after_s` on, what it still waits for,
    whenever that changes."""

    def __init__(self, config, emit, first_after_s: float = 10.0):
        self.config = config  # the ScaleOutConfig
        self.emit = emit  # one line out
        self.first_after_s = first_after_s
        self.last: list[str] = []

    def before_deploying(self, total: dict) -> None:
        for line in shortfall(layout_deployments(self.config), total):
            self.emit(line)

    def poll(self, elapsed_s: float, running: dict[str, int], available: dict, total: dict) -> None:
        if elapsed_s < self.first_after_s:
            return
        lines = waiting_for(layout_deployments(self.config, running), available, total)
        if lines and lines != self.last:
            self.emit(f"waiting for the layout after {elapsed_s:.0f} s: {'; '.join(lines)}")
        self.last = lines


async def cluster_resources() -> tuple[dict, dict]:
    """(available, total) Ray resources of the cluster; empty when Ray cannot say (its calls block: a thread)."""
    import ray

    try:
        return await asyncio.to_thread(lambda: (ray.available_resources(), ray.cluster_resources()))
    except Exception:  # noqa: BLE001 - a probe must answer even when the GCS does not
        return {}, {}
