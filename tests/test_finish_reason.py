"""A path cut by the step token cap (or the context limit) reports OpenAI's finish_reason "length", from the
engine through the search result to the API's choices; a path that ended by itself reports "stop"."""

import json

import pytest

from engine_helpers import serving_pipeline
from specscale.pipeline import PipelineConfig
from specscale.search.presets import preset_config
from specscale.server.responses import CompletionFormat
from specscale.server.search_builder import PreparedSearch

QUESTION = "Tom has 5 coins. Tom finds 3 more. How many coins does Tom have now?"


@pytest.fixture(scope="module")
def toy_pipeline():
    yield from serving_pipeline(PipelineConfig(max_concurrency=4, generator_kv_gb=0.5, prm_kv_gb=0.25))


def solve(pipeline, preset: str, **config):
    request = pipeline.request(QUESTION, preset_config(preset, beam_size=4, beam_width=2, seed=3, **config), "r")
    result = pipeline.runtime().run([request])[0]
    return request, result


def choices(request, result, stream: bool) -> list[dict]:
    prepared = PreparedSearch(request, "best-of-n", 4, "best", 30.0, stream, False, "toy")
    fmt = CompletionFormat(chat=True)
    if not stream:
        return fmt.response(prepared, result)["choices"]
    bodies = [json.loads(chunk.removeprefix("data: ").strip()) for chunk in fmt.final_chunks(prepared, result)]
    return [c for body in bodies for c in body["choices"] if c["finish_reason"] is not None]


@pytest.mark.parametrize("preset", ["best-of-n", "beam"])
def test_truncated_paths_finish_with_length(toy_pipeline, preset):
    request, result = solve(toy_pipeline, preset, max_step_tokens=3, max_rounds=3)
    assert result.paths and all(p.finish_reason == "length" for p in result.paths)
    for stream in (False, True):
        assert [c["finish_reason"] for c in choices(request, result, stream)] == ["length"] * len(result.paths)


def test_paths_that_end_by_themselves_finish_with_stop(toy_pipeline):
    request, result = solve(toy_pipeline, "best-of-n", max_step_tokens=400)
    assert result.paths and all(p.finish_reason == "stop" for p in result.paths)
    assert {c["finish_reason"] for c in choices(request, result, False)} == {"stop"}
