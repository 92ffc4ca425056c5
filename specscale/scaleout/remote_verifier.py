"""RemoteVerifier: the `VerifierBackend` of a generator replica in disaggregated serving — each PRM batch
its search runtime releases goes to the PRM deployment (`VerifierReplica`) over a Ray Serve handle call,
and Serve's router picks the PRM replica (docs/scale-out.md, "Co-located vs disaggregated").

The runtime calls `score` on its engine thread and waits for the scores, as it waits for an in-process
PRM; the PRM replica meanwhile merges this call with the other generator replicas' into one PRM batch.
`tokens_to_compute` is answered here, from the PRM's tokenizer and format (read from the same checkpoint
folder, no weights) and a mirror of the PRM's prefix cache (`ScoredPrefixes`), so lazy verification needs
no round trip per step.

Failures: a call whose PRM replica dies (its actor is lost) or that no PRM replica takes is sent again
(Serve routes it to another PRM replica, or holds it until the one it starts in place of the dead one is
up), a little later each time, until `verifier_timeout_s` has passed since the first try (Serve's router
may route it to the dead replica again before it learns of the death). Past that deadline, lost or
unanswered, it raises `PRMUnavailable`: the engine thread then fails its open searches with a 503 (which
the ingress re-runs on another replica) and the replica's health check reports it, so nothing hangs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ray.exceptions import RayActorError
from ray.serve.exceptions import DeploymentUnavailableError

from specscale.model.loader import read_hf_config
from specscale.model.transformer import ModelArgs
from specscale.pipeline import PipelineConfig
from specscale.scaleout.score_call import ScoreCall, ScoreReply
from specscale.scaleout.scored_prefixes import ScoredPrefixes, fitting_input
from specscale.seam import KVUsage, ScoreRequest, ScoreResult
from specscale.tokenizer import Tokenizer
from specscale.verify.formats import make_format
from specscale.verify.prm import VerifierConfig

RETRY_DELAY_S = 0.2  # before the k-th re-send of a call: k times this, at most RETRY_DELAY_MAX_S
RETRY_DELAY_MAX_S = 2.0
LOST = (RayActorError, DeploymentUnavailableError)  # the PRM replica serving the call went away


class PRMUnavailable(RuntimeError):
    """No PRM replica answered a scoring call within the timeout (however often it was re-sent)."""


class RemoteVerifier:
    def __init__(self, verifiers, pipeline: PipelineConfig, caller: str, timeout_s: float):
        """verifiers: the DeploymentHandle of the PRM deployment. caller: this generator replica's id."""
        self.verifiers = verifiers
        self.caller = caller
        self.timeout_s = timeout_s
        hf_config = read_hf_config(pipeline.prm)
        self.format = make_format(Tokenizer(pipeline.prm), hf_config, None, pipeline.trust_special_tokens)
        self.max_input_tokens = ModelArgs.from_hf_config(hf_config).max_position_embeddings
        self.prefixes = ScoredPrefixes(VerifierConfig.max_cached_prefixes)
        self.prm_kv_seen = KVUsage(0, 0)  # the answering PRM replica's KV after the latest call
        self.retries = 0
        self.waited_s = 0.0  # the engine thread's time in scoring calls (the PRM batch, its wait, the hops)

    # ---- VerifierBackend ---------------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        started = time.perf_counter()
        reply = self._call(ScoreCall(self.caller, tuple(requests)))
        self.waited_s += time.perf_counter() - started
        self.prm_kv_seen = reply.prm_kv
        for request, result in zip(requests, reply.results, strict=True):
            self._remember(request, result)
        return list(reply.results)

    def tokens_to_compute(self, request: ScoreRequest) -> int:
        prm_input = fitting_input(self.format, self.max_input_tokens, request)
        return 0 if prm_input is None else self.prefixes.tokens_to_compute(prm_input)

    @property
    def kv_usage(self) -> KVUsage:
        """None here: the PRM's KV lives in the PRM replicas, which report it themselves (summing the
        latest one seen by every generator replica would count it many times)."""
        return KVUsage(0, 0)

    def render_metrics(self) -> str:
        """This replica's PRM-call retries, in the Prometheus text format (summed over replicas by the ingress)."""
        return ("# HELP specscale_prm_call_retries_total Scoring calls sent again after their PRM replica failed\n"
                "# TYPE specscale_prm_call_retries_total counter\n"
                f"specscale_prm_call_retries_total {self.retries}\n"
                "# HELP specscale_prm_call_seconds_total Time search replicas' engine threads waited for scoring calls\n"
                "# TYPE specscale_prm_call_seconds_total counter\n"
                f"specscale_prm_call_seconds_total {self.waited_s!r}\n")

    def close(self) -> None:
        """Nothing to release here: the PRM replica's LRU cache drops what this replica's searches left."""

    # ---- the call ----------------------------------------------------------------------------------
    def _call(self, call: ScoreCall) -> ScoreReply:
        deadline = time.monotonic() + self.timeout_s
        failures: list[str] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PRMUnavailable(f"the PRM replicas lost a scoring call {len(failures)} times in "
                                     f"{self.timeout_s:g} s ({', '.join(failures)})")
            response = self.verifiers.score.remote(call)
            try:
                return response.result(timeout_s=left)
            except TimeoutError:
                response.cancel()
                raise PRMUnavailable(f"no PRM replica answered a scoring call within {self.timeout_s:g} s") from None
            except LOST as error:
                failures.append(type(error).__name__)
                self.retries += 1
                time.sleep(min(RETRY_DELAY_S * len(failures), RETRY_DELAY_MAX_S))

    def _remember(self, request: ScoreRequest, result: ScoreResult) -> None:
        """Mirror the PRM's cache insert: a path whose fitting steps were all scored is cached there."""
        prm_input = fitting_input(self.format, self.max_input_tokens, request)
        if prm_input is not None and len(result.step_scores) == prm_input.num_steps:
            self.prefixes.record(prm_input)
