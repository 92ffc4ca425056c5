"""ScaleOutConfig: how many search replicas Ray Serve runs, what each reserves, and how much the ingress
queues in front of them (docs/scale-out.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specscale.pipeline import PipelineConfig
from specscale.server.settings import ServerSettings

INGRESS_MAX_ONGOING = 4096  # HTTP requests one ingress replica holds at once (its work is forwarding)
VERIFIER_POLL_SLOTS = 8  # /health and /metrics polls a PRM replica answers beside the generators' calls


@dataclass(frozen=True)
class ScaleOutConfig:
    """replicas: search replicas (each a generator engine + PRM verifier + search runtime on one engine
    thread). replica_cpus / replica_gpus: the Ray resources each one reserves. threads: torch CPU threads
    per replica (None: replica_cpus rounded down, at least 1). router_queue: searches the ingress holds
    while Serve's router finds them a replica slot (None: as many as the replicas hold, so that a burst the
    cluster can take is never refused); one more is refused with 429 + Retry-After.

    Disaggregated serving (docs/scale-out.md, "Co-located vs disaggregated"): verifier_replicas PRM
    replicas as a deployment of their own (0: every search replica holds its own PRM, co-located), each
    reserving verifier_cpus / verifier_gpus. A PRM replica merges the scoring calls of the generator
    replicas that arrive within verifier_batch_wait_s of the first into one PRM batch (at most one call per
    generator replica: each has one engine thread, which waits for its scores). A generator replica gives
    a call verifier_timeout_s to be answered and retries it once (e.g. on a PRM replica that Ray Serve is
    replacing) before it reports the PRM unavailable."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    settings: ServerSettings = field(default_factory=ServerSettings)
    replicas: int = 1
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    threads: int | None = None
    router_queue: int | None = None
    health_check_period_s: float = 2.0
    verifier_replicas: int = 0
    verifier_cpus: float = 1.0
    verifier_gpus: float = 0.0
    verifier_batch_wait_s: float = 0.01
    verifier_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.replica_cpus < 0 or self.replica_gpus < 0:
            raise ValueError(f"replica_cpus and replica_gpus must be >= 0, got {self.replica_cpus}, "
                             f"{self.replica_gpus}")
        if self.router_queue is not None and self.router_queue < 1:
            raise ValueError(f"router_queue must be >= 1, got {self.router_queue}")
        if self.verifier_replicas < 0 or self.verifier_cpus < 0 or self.verifier_gpus < 0:
            raise ValueError(f"verifier_replicas, verifier_cpus and verifier_gpus must be >= 0, got "
                             f"{self.verifier_replicas}, {self.verifier_cpus}, {self.verifier_gpus}")
        if self.verifier_batch_wait_s < 0 or self.verifier_timeout_s <= 0:
            raise ValueError(f"verifier_batch_wait_s must be >= 0 and verifier_timeout_s positive, got "
                             f"{self.verifier_batch_wait_s}, {self.verifier_timeout_s}")

    @property
    def disaggregated(self) -> bool:
        """The PRM runs in replicas of its own, shared by every search (generator) replica."""
        return self.verifier_replicas > 0

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

    @property
    def verifier_torch_threads(self) -> int:
        return self.threads or max(int(self.verifier_cpus), 1)

    @property
    def verifier_batch_calls(self) -> int:
        """Calls a PRM replica's batch waits for at most: its share of the generator replicas (Serve's router
        spreads their calls over the PRM replicas), at least 1."""
        return max(-(-self.replicas // max(self.verifier_replicas, 1)), 1)

    @property
    def verifier_capacity(self) -> int:
        """Calls one PRM replica takes at once: every generator replica's one call, and the ingress's polls."""
        return self.replicas + VERIFIER_POLL_SLOTS
