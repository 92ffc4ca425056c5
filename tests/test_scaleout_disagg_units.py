"""The parts of disaggregated `specscale serve --ray --verifier-replicas V` that need no Ray instance: a
generator replica's `RemoteVerifier` (its re-sends after a lost PRM replica, its bounded wait, its
local estimate of the PRM tokens lazy verification counts, checked against a real verifier's), the PRM
replica's batch counters, the config and the flags."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError

from checkpoints import build_qwen_prm_checkpoint
from specscale.cli import build_parser
from specscale.config import EngineConfig
from specscale.pipeline import PipelineConfig
from specscale.scaleout.cluster_counters import ClusterCounters
from specscale.scaleout.command import scale_out_config
from specscale.scaleout.config import ScaleOutConfig
from specscale.scaleout.prm_batch_counters import PRMBatchCounters
from specscale.scaleout.remote_verifier import PRMUnavailable, RemoteVerifier
from specscale.scaleout.score_call import ScoreCall, ScoreReply
from specscale.seam import KVUsage, ScoreRequest, ScoreResult
from specscale.serve import pipeline_config, run_serve, server_settings
from specscale.verify.prm import Verifier, VerifierConfig

QUESTION = "Tom has 12 apples. He buys 7 more. How many apples does Tom have?"


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    return build_qwen_prm_checkpoint(tmp_path_factory.mktemp("prm"))


class ScriptedResponse:
    """A DeploymentResponse whose `result` returns or raises what the script says."""

    def __init__(self, outcome):
        self.outcome = outcome
        self.cancelled = False

    def result(self, timeout_s: float):
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedVerifiers:
    """Stands in for the PRM deployment's handle: each `score.remote` takes the next scripted outcome (a
    callable of the call gives the reply)."""

    def __init__(self, outcomes: list):
        self.outcomes = outcomes
        self.calls: list[ScoreCall] = []
        self.responses: list[ScriptedResponse] = []
        self.score = self

    def remote(self, call: ScoreCall) -> ScriptedResponse:
        self.calls.append(call)
        outcome = self.outcomes.pop(0)
        response = ScriptedResponse(outcome(call) if callable(outcome) else outcome)
        self.responses.append(response)
        return response


def _reply(call: ScoreCall) -> ScoreReply:
    results = tuple(ScoreResult((0.5,) * len(r.steps), len(r.steps)) for r in call.requests)
    return ScoreReply(results, KVUsage(3, 10), merged_callers=2)


def _remote(prm_dir, outcomes: list, timeout_s: float = 5.0) -> tuple[RemoteVerifier, ScriptedVerifiers]:
    handle = ScriptedVerifiers(outcomes)
    return RemoteVerifier(handle, PipelineConfig(prm=str(prm_dir)), "generator-a", timeout_s=timeout_s), handle


def test_a_scoring_call_whose_prm_replica_died_is_sent_again_until_one_answers(prm_dir):
    """Serve's router may send the re-sent call to the dead replica again before it learns of the death."""
    remote, handle = _remote(prm_dir, [ActorDiedError(), ActorDiedError(), ActorDiedError(), _reply])
    requests = [ScoreRequest(QUESTION, ("Step 1: 12 + 7 = 19.\n\n",)), ScoreRequest(QUESTION, ("Step 1: 5.\n\n",))]
    results = remote.score(requests)
    assert [r.step_scores for r in results] == [(0.5,), (0.5,)]
    assert len(handle.calls) == 4 and handle.calls[3] == ScoreCall("generator-a", tuple(requests))
    assert remote.retries == 3 and "specscale_prm_call_retries_total 3" in remote.render_metrics()
    assert remote.prm_kv_seen == KVUsage(3, 10) and remote.kv_usage == KVUsage(0, 0)  # reported by the PRM replicas


def test_losses_past_the_deadline_or_a_timeout_raise_prm_unavailable_instead_of_waiting(prm_dir):
    remote, handle = _remote(prm_dir, [ActorDiedError()] * 20, timeout_s=0.5)  # re-sent after 0.2 s, 0.4 s: 2 s
    with pytest.raises(PRMUnavailable, match="lost a scoring call 2 times in 0.5 s"):
        remote.score([ScoreRequest(QUESTION, ("Step 1.\n\n",))])
    assert len(handle.calls) == 2

    remote, handle = _remote(prm_dir, [TimeoutError()])
    with pytest.raises(PRMUnavailable, match="within 5 s"):
        remote.score([ScoreRequest(QUESTION, ("Step 1.\n\n",))])
    assert len(handle.calls) == 1 and handle.responses[0].cancelled  # the PRM replica drops the call


def test_the_local_token_estimate_follows_the_prm_cache_of_a_real_verifier(prm_dir):
    """Lazy verification counts PRM tokens per queued step; a remote verifier estimates them here from
    the paths it had scored, which is what the PRM's own step-prefix cache holds."""
    verifier = Verifier(VerifierConfig(EngineConfig(model=str(prm_dir), kv_cache_memory_gb=0.05)))
    remote, _ = _remote(prm_dir, [lambda call: ScoreReply(tuple(verifier.score(call.requests)), KVUsage(0, 0), 1)] * 2)
    first = [ScoreRequest(QUESTION, ("Step 1: 12 + 7 = 19.\n\n",)), ScoreRequest(QUESTION, ("Step 1: 12 - 7.\n\n",))]
    second = [ScoreRequest(QUESTION, (*first[0].steps, "Step 2: so 19 apples.\n\n")),
              ScoreRequest(QUESTION, (*first[1].steps, "Step 2: 5 apples.\n\n", "Step 3: done.\n\n")),
              ScoreRequest(QUESTION, ("Step 1: a fresh path.\n\n",)), ScoreRequest(QUESTION, ("\n\n",))]
    for batch in (first, second):
        estimates = [remote.tokens_to_compute(r) for r in batch]
        assert estimates == [verifier.tokens_to_compute(r) for r in batch]
        remote.score(batch)
    after = [remote.tokens_to_compute(r) for r in second]
    assert after == [verifier.tokens_to_compute(r) for r in second] == [0, 0, 0, 0]  # every path is cached now
    third = ScoreRequest(QUESTION, (*second[0].steps, "Step 3: the answer is 19.\n\n"))
    whole = remote.tokens_to_compute(ScoreRequest("Another question?", third.steps))
    assert 0 < remote.tokens_to_compute(third) == verifier.tokens_to_compute(third) < whole  # only step 3 is new
    verifier.close()


def test_prm_batch_counters_count_batches_by_generator_replicas_merged():
    counters = PRMBatchCounters()
    counters.batch(callers=2, calls=2, paths=7, computed_tokens=300)
    counters.batch(callers=1, calls=1, paths=2, computed_tokens=40)
    counters.failure()
    lines = counters.render(KVUsage(5, 20)).splitlines()
    assert 'specscale_prm_batches_total{generator_replicas="2"} 1' in lines
    assert 'specscale_prm_batches_total{generator_replicas="1"} 1' in lines
    assert "specscale_prm_calls_total 3" in lines and "specscale_prm_paths_total 9" in lines
    assert "specscale_prm_computed_tokens_total 340" in lines and "specscale_prm_batch_failures_total 1" in lines
    assert "specscale_prm_kv_blocks_used 5" in lines
    verifier_lines = ClusterCounters.render_verifiers(reporting=1, target=2).splitlines()
    assert 'specscale_verifier_replicas{state="target"} 2' in verifier_lines


def test_verifier_flags_build_a_disaggregated_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["serve", "--ray", "--replicas", "6", "--verifier-replicas", "2",
                                      "--verifier-cpus", "4", "--verifier-gpus", "1", "--verifier-batch-wait-ms", "20",
                                      "--generator", "gen", "--prm", "prm"])
    config = scale_out_config(args, pipeline_config(args), server_settings(args))
    assert config.disaggregated and config.verifier_replicas == 2 and config.verifier_cpus == 4
    assert config.verifier_gpus == 1 and config.verifier_batch_wait_s == pytest.approx(0.02)
    assert config.verifier_capacity >= 6 and config.verifier_torch_threads == 4
    assert config.verifier_batch_calls == 3  # 6 generator replicas' calls spread over 2 PRM replicas
    assert ScaleOutConfig(replicas=2, verifier_replicas=1).verifier_batch_calls == 2
    assert not ScaleOutConfig().disaggregated
    with pytest.raises(ValueError, match="verifier_replicas"):
        ScaleOutConfig(verifier_replicas=-1)
    with pytest.raises(ValueError, match="verifier_timeout_s"):
        ScaleOutConfig(verifier_timeout_s=0)


def test_verifier_replicas_without_ray_are_refused_before_any_model_loads(capsys):
    args = build_parser().parse_args(["serve", "--verifier-replicas", "1"])
    assert run_serve(args) == 2
    assert "--verifier-replicas needs --ray" in capsys.readouterr().out
