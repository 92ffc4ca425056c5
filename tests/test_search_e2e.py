"""Every preset end to end through the real engine and the real PRM verifier on random-weight checkpoints
(a Qwen-Math-PRM-format PRM): 32 concurrent requests answered, zero KV blocks in use afterwards. Cancelling
and admission on the real engine: tests/test_search.py's "toy" backend."""

import pytest

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from engine_helpers import serving_pipeline
from specscale.pipeline import PipelineConfig
from specscale.search.presets import PRESETS, preset_config


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    generator = build_stepping_generator(tmp_path_factory.mktemp("gen"))
    prm = build_qwen_prm_checkpoint(tmp_path_factory.mktemp("prm"))
    yield from serving_pipeline(PipelineConfig(generator=str(generator), prm=str(prm), lv_threshold_tokens=256,
                                               generator_kv_gb=0.25, prm_kv_gb=0.25))


def search_config(preset, seed):
    return preset_config(preset, beam_size=8, beam_width=4, max_rounds=5, max_step_tokens=24, seed=seed)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_answers_32_concurrent_requests(pipeline, preset):
    requests = [pipeline.request(f"Question {i}: 12 + {i} = ?", search_config(preset, i), f"{preset}-{i}")
                for i in range(32)]
    results = pipeline.runtime().run(requests)
    assert len(results) == 32
    for r in results:
        assert r.error is None and r.paths and r.best is not None
        assert all(0.0 <= s <= 1.0 for p in r.paths for s in p.step_scores)
        assert r.usage.output_tokens == sum(p.num_tokens * p.copies for p in r.paths) > 0
        assert r.timings.total_s >= r.timings.generation_s
    assert pipeline.engine.block_manager.num_used_blocks == 0
    assert pipeline.engine.num_live_sequences == 0

