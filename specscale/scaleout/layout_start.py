"""Whether the Ray layout of `specscale serve --ray` has come up, and what it still waits for.

A deployment short of its replicas before the layout was ever whole is still starting (Ray has not scheduled
or loaded them yet); after every deployment has had all its replicas running at once, one short of them lost a
replica (Serve replaces it). `/health` answers 503 "starting" for the former with `waiting_for`: one line per
deployment short of replicas, with what each replica reserves and what the cluster has free (Ray's resources
API), which says when the layout cannot be scheduled at all.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

RESOURCES = (("CPU", "CPUs"), ("GPU", "GPUs"))  # Ray's resource name, as a line says it


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


async def cluster_resources() -> tuple[dict, dict]:
    """(available, total) Ray resources of the cluster; empty when Ray cannot say (its calls block: a thread)."""
    import ray

    try:
        return await asyncio.to_thread(lambda: (ray.available_resources(), ray.cluster_resources()))
    except Exception:  # noqa: BLE001 - a probe must answer even when the GCS does not
        return {}, {}
