"""Every preset on the bundled toy models: 32 concurrent requests answered with the real engine and
PRM, enough of them right, zero KV blocks in use afterwards. Cancelling and admission on these models:
tests/test_search.py's "toy" backend."""

import pytest

from engine_helpers import serving_pipeline
from specscale.pipeline import PipelineConfig
from specscale.search.presets import PRESETS, preset_config
from specscale_lab.tasks.toy import is_correct, toy_problems

PROBLEMS = toy_problems("test", 32, seed=7)


@pytest.fixture(scope="module")
def toy_pipeline():
    yield from serving_pipeline(PipelineConfig(lv_threshold_tokens=1024, generator_kv_gb=0.5, prm_kv_gb=0.25))


def config(preset, seed):
    return preset_config(preset, beam_size=4, beam_width=2, max_rounds=12, max_step_tokens=96, seed=seed)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_answers_32_toy_requests(toy_pipeline, preset):
    requests = [toy_pipeline.request(p.question, config(preset, i), f"{preset}-{i}") for i, p in enumerate(PROBLEMS)]
    results = toy_pipeline.runtime().run(requests)
    assert all(r.error is None and r.best is not None for r in results)
    assert toy_pipeline.engine.block_manager.num_used_blocks == 0
    correct = sum(is_correct(p, r.best.text) for p, r in zip(PROBLEMS, results, strict=True))
    assert correct >= 4, f"{preset} solved only {correct}/32 toy problems"  # the models really reason

