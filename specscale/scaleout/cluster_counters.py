"""ClusterCounters: what the ingress alone sees — requests whose replica was lost, and what became of
them (retried on another replica, or answered 503) — in the Prometheus text format, beside the
replicas' summed series (docs/scale-out.md)."""

from __future__ import annotations

import threading


class ClusterCounters:
    def __init__(self):
        self.lock = threading.Lock()
        self.replicas_lost = 0
        self.retries: dict[str, int] = {}
        self.replica_ids: set[str] = set()

    def replica_lost(self) -> None:
        with self.lock:
            self.replicas_lost += 1

    def retry(self, outcome: str) -> None:
        with self.lock:
            self.retries[outcome] = self.retries.get(outcome, 0) + 1

    def saw_replicas(self, replica_ids: list[str]) -> None:
        with self.lock:
            self.replica_ids.update(replica_ids)

    def render(self, replicas_reporting: int, replicas_target: int) -> str:
        with self.lock:
            lines = [
                "# HELP specscale_replicas Search replicas: target (configured) and reporting (answered the "
                "latest /health or /metrics poll)",
                "# TYPE specscale_replicas gauge",
                f'specscale_replicas{{state="target"}} {replicas_target}',
                f'specscale_replicas{{state="reporting"}} {replicas_reporting}',
                "# HELP specscale_replicas_seen_total Distinct search replicas seen by the ingress's polls "
                "(more than the target: Ray Serve replaced some)",
                "# TYPE specscale_replicas_seen_total counter",
                f"specscale_replicas_seen_total {len(self.replica_ids)}",
                "# HELP specscale_replica_failures_total Requests whose replica died or became unreachable under them",
                "# TYPE specscale_replica_failures_total counter",
                f"specscale_replica_failures_total {self.replicas_lost}",
                "# HELP specscale_request_retries_total Requests after a replica failure: retried on another "
                "replica, or not retried (answered 503)",
                "# TYPE specscale_request_retries_total counter",
            ]
            lines += [f'specscale_request_retries_total{{outcome="{o}"}} {n}' for o, n in sorted(self.retries.items())]
            return "\n".join(lines) + "\n"

    @staticmethod
    def render_verifiers(reporting: int, target: int) -> str:
        """The PRM replicas of disaggregated serving: target (configured) and reporting."""
        return "\n".join([
            "# HELP specscale_verifier_replicas PRM replicas: target (configured) and reporting (answered the "
            "latest /health or /metrics poll)",
            "# TYPE specscale_verifier_replicas gauge",
            f'specscale_verifier_replicas{{state="target"}} {target}',
            f'specscale_verifier_replicas{{state="reporting"}} {reporting}',
        ]) + "\n"
