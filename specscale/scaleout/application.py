"""The Ray Serve application of `specscale serve --ray`: R `SearchReplica`s behind one `Ingress`
(docs/scale-out.md). Routing is Ray Serve's own (its default request router: of two replicas drawn at
random, the one with fewer requests in flight — least outstanding requests when R <= 2); a replica gets
at most its capacity (running + waiting searches) and the ingress queues at most `ingress_queue` more
before answering 429. With `verifier_replicas`, a `VerifierReplica` deployment holds the PRM and every
search replica scores through it (disaggregated serving)."""

from __future__ import annotations

from ray import serve
from ray.serve.config import BackpressureConfig

from specscale.scaleout.config import INGRESS_MAX_ONGOING, ScaleOutConfig
from specscale.scaleout.ingress import Ingress
from specscale.scaleout.replica import SearchReplica

APP_NAME = "specscale"


def build_application(config: ScaleOutConfig):
    replica = serve.deployment(
        SearchReplica, name="SearchReplica", num_replicas=config.replicas,
        ray_actor_options={"num_cpus": config.replica_cpus, "num_gpus": config.replica_gpus},
        max_ongoing_requests=config.replica_capacity, max_queued_requests=config.ingress_queue,
        health_check_period_s=config.health_check_period_s, graceful_shutdown_timeout_s=5,
    )
    retry_after = BackpressureConfig(status_code=429, retry_after_s=config.settings.retry_after_s)
    ingress = serve.deployment(
        Ingress, name="Ingress", num_replicas=1, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=INGRESS_MAX_ONGOING, max_queued_requests=INGRESS_MAX_ONGOING,
        backpressure_config=retry_after,
    )
    verifiers = _verifier_deployment(config).bind(config) if config.disaggregated else None
    return ingress.bind(config, replica.bind(config, verifiers), verifiers)


def _verifier_deployment(config: ScaleOutConfig):
    """The PRM replicas of disaggregated serving, each taking a call from every generator replica at once."""
    from specscale.scaleout.verifier_replica import VerifierReplica

    return serve.deployment(
        VerifierReplica, name="VerifierReplica", num_replicas=config.verifier_replicas,
        ray_actor_options={"num_cpus": config.verifier_cpus, "num_gpus": config.verifier_gpus},
        max_ongoing_requests=config.verifier_capacity, health_check_period_s=config.health_check_period_s,
        graceful_shutdown_timeout_s=5,
    )
