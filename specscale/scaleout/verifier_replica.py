"""VerifierReplica: one Ray Serve replica of the PRM deployment in disaggregated serving
(`specscale serve --ray --verifier-replicas V`, docs/scale-out.md, "Co-located vs disaggregated").

It holds one PRM verifier (verify/prm.py, with its step-prefix cache) and answers the generator replicas'
scoring calls. Ray Serve's `@serve.batch` collects the calls that arrive together — at most one per
generator replica (its engine thread waits for its scores), starting the batch once its share of the
generator replicas' calls is in or `verifier_batch_wait_s` after the first — and the replica scores all their paths as one PRM batch: lazy verification's cross-request
batching, across generator replicas. Calls that arrive while a batch runs form the next one. The PRM runs
on a thread of its own, so `/health` and `/metrics` polls are answered during a batch.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

from ray import serve

from specscale.model.memory import MIB, process_resident_bytes
from specscale.model.row_padding import warm_engines
from specscale.pipeline import build_verifier
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.prm_batch_counters import PRMBatchCounters
from specscale.scaleout.replica import ReplicaStatus
from specscale.scaleout.score_call import ScoreCall, ScoreReply
from specscale.seam import ScoreResult


class VerifierReplica:
    def __init__(self, config: ScaleOutConfig):
        import torch

        torch.set_num_threads(config.verifier_torch_threads)
        self.verifier = build_verifier(config.pipeline)
        warm_engines([self.verifier.engine])  # oneDNN's primitive for every row count now (model/row_padding.py)
        self.counters = PRMBatchCounters()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="specscale-prm")  # the one thread that runs the PRM
        self._score_batch.set_max_batch_size(config.verifier_batch_calls)
        self._score_batch.set_batch_wait_timeout_s(config.verifier_batch_wait_s)
        self.replica_id = serve.get_replica_context().replica_tag
        self.started_at = time.time()

    async def score(self, call: ScoreCall) -> ScoreReply:
        """One generator replica's PRM batch, scored inside a PRM batch shared with the others' calls."""
        return await self._score_batch(call)

    @serve.batch(max_batch_size=2, batch_wait_timeout_s=0.01)  # both reset per config in __init__
    async def _score_batch(self, calls: list[ScoreCall]) -> list[ScoreReply]:
        requests = [request for call in calls for request in call.requests]
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            results = await loop.run_in_executor(self.executor, self.verifier.score, requests)
        except Exception:
            self.counters.failure()  # every call of the batch gets the error
            raise
        callers = len({call.caller for call in calls})
        self.counters.batch(callers, len(calls), len(requests), sum(r.computed_tokens for r in results),
                            time.perf_counter() - started)
        return self._replies(calls, results, callers)

    def _replies(self, calls: list[ScoreCall], results: list[ScoreResult], callers: int) -> list[ScoreReply]:
        kv = self.verifier.kv_usage
        replies, start = [], 0
        for call in calls:
            end = start + len(call.requests)
            replies.append(ScoreReply(tuple(results[start:end]), kv, callers))
            start = end
        return replies

    def status(self) -> ReplicaStatus:
        import ray

        kv = self.verifier.kv_usage
        memory = {"process_rss_mib": round(process_resident_bytes() / MIB, 1),
                  "prm": self.verifier.engine.model_memory().as_dict()}
        health = {"status": "ok", "error": None, "prm_kv_blocks_used": kv.used_blocks,
                  "prm_kv_blocks_total": kv.total_blocks, "prm_paths_scored": self.verifier.stats.paths,
                  "memory": memory}
        return ReplicaStatus(self.replica_id, os.getpid(), ray.get_runtime_context().get_node_id(),
                             self.started_at, health, self.counters.render(kv))

    def __del__(self) -> None:
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.shutdown(wait=False)
            self.verifier.close()
