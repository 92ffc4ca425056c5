"""ScaleOutConfig: how many search replicas Ray Serve runs, what each reserves, and how much the ingress
queues in front of them (docs/scale-out.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specscale.pipeline import PipelineConfig
from specscale.server.settings import ServerSettings

INGRESS_MAX_ONGOING = 4096  # HTTP requests one ingress replica holds at once (its work is forwarding)


@dataclass(frozen=True)
class ScaleOutConfig:
    """replicas: search replicas (each a generator engine + PRM verifier + search runtime on one engine
    thread). replica_cpus / replica_gpus: the Ray resources each one reserves. threads: torch CPU threads
    per replica (None: replica_cpus rounded down, at least 1). router_queue: searches the ingress holds
    while Serve's router finds them a replica slot (None: as many as the replicas hold, so that a burst the
    cluster can take is never refused); one more is refused with 429 + Retry-After."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    settings: ServerSettings = field(default_factory=ServerSettings)
    replicas: int = 1
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    threads: int | None = None
    router_queue: int | None = None
    health_check_period_s: float = 2.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.replica_cpus < 0 or self.replica_gpus < 0:
            raise ValueError(f"replica_cpus and replica_gpus must be >= 0, got {self.replica_cpus}, "
                             f"{self.replica_gpus}")
        if self.router_queue is not None and self.router_queue < 1:
            raise ValueError(f"router_queue must be >= 1, got {self.router_queue}")

    @property
    def replica_capacity(self) -> int:
        """Searches one replica holds: running plus waiting, what its engine loop admits before a 429.
        Ray Serve's router sends a replica no more than this (its `max_ongoing_requests`)."""
        return self.pipeline.max_concurrency + self.settings.max_waiting

    @property
    def ingress_queue(self) -> int:
        """Serve's `max_queued_requests` for the replicas, at the ingress's router."""
        return self.router_queue or self.replicas * self.replica_capacity

    @property
    def torch_threads(self) -> int:
        return self.threads or max(int(self.replica_cpus), 1)
