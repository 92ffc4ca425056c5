"""PrmBatches: the search runtime's verifier side (docs/architecture.md, steps 7 to 9).

A `Verify` action becomes a queued step of `runtime/verify_queue.py` with its verification policy's batching
and, for lazy verification, its request's flush policy (`runtime/lazy_flush.py`), built once per request at
the verifier's token threshold when it is submitted (`flush_policy_of`); an adaptive policy reads the
generator's state through `signals`; a PRM batch the queue releases is scored in one verifier call, its time
counted for the run and for each request in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from specscale.config import SearchConfig
from specscale.runtime.backend import VerifierBackend
from specscale.runtime.lazy_flush import FlushSignals, LazyFlushPolicy, flush_policy
from specscale.runtime.metrics import RunMetrics
from specscale.runtime.request_state import RequestState
from specscale.runtime.sequences import Sequences
from specscale.runtime.verify_queue import BATCHINGS, RIDE_ALONG, QueuedStep, VerifyQueue
from specscale.seam import ScoreRequest, ScoreResult
from specscale.search.protocol import Verify
from specscale.search.verification import LAZY, VERIFICATION


class PrmBatches:
    def __init__(self, verifier: VerifierBackend, queue: VerifyQueue, sequences: Sequences,
                 clock: Callable[[], float], lv_threshold_tokens: int):
        self.verifier = verifier
        self.queue = queue
        self.sequences = sequences
        self.clock = clock
        self.lv_threshold_tokens = lv_threshold_tokens

    def flush_policy_of(self, config: SearchConfig) -> LazyFlushPolicy | None:
        """A request's lazy-verification trigger at the verifier's threshold; None unless its verification is lazy."""
        lazy = VERIFICATION.chosen(config).batching is LAZY
        return flush_policy(config, self.lv_threshold_tokens) if lazy else None

    def enqueue(self, state: RequestState, action: Verify) -> None:
        request = ScoreRequest(state.request.question, action.steps)
        # the policy the request's search was built with; a partial-step readout rides along whatever it is
        batching = RIDE_ALONG if action.partial else BATCHINGS[state.search.verification.batching]
        self.queue.push(QueuedStep(
            state, action.candidate, request, action.completes_group, batching,
            self.verifier.tokens_to_compute(request), self.clock(), state.flush_policy,
        ))

    def signals(self, metrics: RunMetrics) -> FlushSignals:
        """What an adaptive lazy-verification policy weighs (runtime/lazy_flush.py), read now."""
        kv = self.sequences.generator.kv_usage
        calls = len(metrics.verifier_batch_items)
        speculative = self.sequences.speculative_tokens()
        return FlushSignals(kv.used_blocks / kv.total_blocks if kv.total_blocks else 0.0,
                            metrics.verification_s / calls if calls else None, speculative)

    def score(self, batch: list[QueuedStep], metrics: RunMetrics) -> tuple[list[ScoreResult], float]:
        """One verifier call over the batch: the step scores, in batch order, and when they arrived."""
        start = self.clock()
        results = self.verifier.score([item.score_request for item in batch])
        now = self.clock()
        metrics.verification_s += now - start
        requests = {request_of(item) for item in batch}
        metrics.verifier_call(len(batch), sum(item.tokens for item in batch), len(requests))
        for state in requests:
            state.verification_s += now - start
        return results, now


def request_of(item: QueuedStep) -> RequestState:
    """The request state a queued step belongs to (typed `object` in the queue, which cannot import it)."""
    return cast(RequestState, item.request)
