"""PRMBatchCounters: what a PRM replica of disaggregated serving did, in the Prometheus text format
(docs/scale-out.md): its PRM batches by how many generator replicas' calls each merged (the cross-replica
batching that disaggregation is for), the calls, paths and PRM tokens they held, and failed batches. The
ingress sums them over the PRM replicas with the search replicas' series."""

from __future__ import annotations

import threading

from specscale.seam import KVUsage


class PRMBatchCounters:
    def __init__(self):
        self.lock = threading.Lock()
        self.batches_by_callers: dict[int, int] = {}  # distinct generator replicas in a batch -> batches
        self.calls = 0
        self.paths = 0
        self.computed_tokens = 0
        self.failed_batches = 0
        self.seconds = 0.0  # time the PRM spent scoring batches

    def batch(self, callers: int, calls: int, paths: int, computed_tokens: int, seconds: float = 0.0) -> None:
        with self.lock:
            self.seconds += seconds
            self.batches_by_callers[callers] = self.batches_by_callers.get(callers, 0) + 1
            self.calls += calls
            self.paths += paths
            self.computed_tokens += computed_tokens

    def failure(self) -> None:
        with self.lock:
            self.failed_batches += 1

    def render(self, kv: KVUsage) -> str:
        with self.lock:
            lines = [
                "# HELP specscale_prm_batches_total PRM batches run by the PRM replicas, by how many generator "
                "replicas' calls each merged",
                "# TYPE specscale_prm_batches_total counter",
                *(f'specscale_prm_batches_total{{generator_replicas="{callers}"}} {count}'
                  for callers, count in sorted(self.batches_by_callers.items())),
                "# HELP specscale_prm_calls_total Scoring calls from generator replicas answered by the PRM replicas",
                "# TYPE specscale_prm_calls_total counter",
                f"specscale_prm_calls_total {self.calls}",
                "# HELP specscale_prm_paths_total Paths scored by the PRM replicas",
                "# TYPE specscale_prm_paths_total counter",
                f"specscale_prm_paths_total {self.paths}",
                "# HELP specscale_prm_computed_tokens_total PRM input tokens run by the PRM replicas",
                "# TYPE specscale_prm_computed_tokens_total counter",
                f"specscale_prm_computed_tokens_total {self.computed_tokens}",
                "# HELP specscale_prm_batch_seconds_total Time the PRM replicas spent scoring their batches",
                "# TYPE specscale_prm_batch_seconds_total counter",
                f"specscale_prm_batch_seconds_total {self.seconds!r}",
                "# HELP specscale_prm_batch_failures_total PRM batches that raised (their calls got the error)",
                "# TYPE specscale_prm_batch_failures_total counter",
                f"specscale_prm_batch_failures_total {self.failed_batches}",
                "# HELP specscale_prm_kv_blocks_used PRM KV blocks held (cached step prefixes)",
                "# TYPE specscale_prm_kv_blocks_used gauge",
                f"specscale_prm_kv_blocks_used {kv.used_blocks}",
            ]
            return "\n".join(lines) + "\n"
