"""A path whose PRM input outgrows the PRM's context: an explicit error, never a silent truncation.

The verifier marks the result (`ScoreResult.exceeds_context`, test_verifier.py checks the scores of the
steps that fit); the search finishes the path there and its completed path carries the error."""

import pytest

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from engine_helpers import serving_pipeline
from specscale.pipeline import PipelineConfig
from specscale.seam import ScoreRequest
from specscale.search.presets import preset_config
from specscale.verify.formats import clean_steps

PRM_CONTEXT = 96  # positions of the PRM: a few 24-token steps fit, five do not


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    generator = build_stepping_generator(tmp_path_factory.mktemp("gen"), eos_rate=0.0)
    prm = build_qwen_prm_checkpoint(tmp_path_factory.mktemp("prm"), max_position_embeddings=PRM_CONTEXT)
    yield from serving_pipeline(PipelineConfig(generator=str(generator), prm=str(prm), lv_threshold_tokens=256,
                                               generator_kv_gb=0.1, prm_kv_gb=0.1))


def test_the_verifier_flags_an_input_past_the_prm_context(pipeline):
    steps = ("1 + 1 = 2.\n\n",) * 12
    long_result, short_result = pipeline.verifier.score([ScoreRequest("Q?", steps), ScoreRequest("Q?", steps[:1])])
    assert long_result.exceeds_context and not long_result.ok and "exceeds the PRM context of 96" in long_result.error
    assert 0 < len(long_result.step_scores) < 12
    assert short_result.ok and not short_result.exceeds_context and len(short_result.step_scores) == 1
    pipeline.verifier.clear()


def test_a_search_past_the_prm_context_returns_paths_that_carry_the_error(pipeline):
    config = preset_config("beam", beam_size=4, beam_width=2, max_rounds=8, max_step_tokens=24, seed=3)
    results = pipeline.runtime().run([pipeline.request(f"Question {i}: 12 + {i} = ?", config, f"r{i}") for i in range(3)])
    paths = [path for result in results for path in result.paths]
    assert all(result.error is None and result.paths for result in results)
    cut = [path for path in paths if path.score_error is not None]
    assert cut, "no path outgrew the PRM context: make the steps longer or the context shorter"
    for path in cut:
        assert "exceeds the PRM context of 96" in path.score_error
        assert len(path.step_scores) < len(clean_steps(path.steps))  # the score covers only the steps that fit
    for path in paths:
        if path.score_error is None:
            assert len(path.step_scores) == len(clean_steps(path.steps))
    assert pipeline.engine.block_manager.num_used_blocks == 0
