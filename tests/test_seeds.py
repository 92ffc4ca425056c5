"""Seeds (docs/design.md, "Seeds"): every child seed comes from a real mixer over the request seed, the tree
position and the child index, so no two nodes share a stream by construction."""

import pytest

from engine_helpers import serving_pipeline
from specscale.pipeline import PipelineConfig
from specscale.search.presets import preset_config
from specscale.search.seeds import SEED_BITS, child_seed, child_seeds


def test_ten_thousand_derived_seeds_are_distinct():
    seeds = {child_seed(request, key, index)
             for request in range(25) for key in ((), (0,), (1,), (0, 3)) for index in range(100)}
    assert len(seeds) == 25 * 4 * 100 == 10_000
    assert all(0 <= s < 2**SEED_BITS for s in seeds)


def test_neighbouring_request_seeds_share_no_child_seed():
    """The old rule (base >> 4) + index gave request seeds 0..15 the same children and 16 three of 0's."""
    first = set(child_seeds(0, (), 0, 8))
    for other in (1, 15, 16, 1_000_003):
        assert not first & set(child_seeds(other, (), 0, 8))


def test_a_cd_expansion_covers_the_seeds_of_the_children_it_replaces():
    assert child_seeds(7, (2, 1), 4, 3) == tuple(child_seed(7, (2, 1), i) for i in (4, 5, 6))
    assert child_seeds(None, (), 0, 4) is None


@pytest.fixture(scope="module")
def toy_pipeline():
    yield from serving_pipeline(PipelineConfig(max_concurrency=4, generator_kv_gb=0.5, prm_kv_gb=0.25))


def test_request_seeds_0_and_15_give_different_best_of_n_samples(toy_pipeline):
    question = "Tom has 5 coins. Tom finds 3 more. How many coins does Tom have now?"
    samples = []
    for seed in (0, 15, 0):
        config = preset_config("best-of-n", beam_size=4, beam_width=4, seed=seed, max_step_tokens=96)
        result = toy_pipeline.runtime().run([toy_pipeline.request(question, config)])[0]
        samples.append(sorted(p.text for p in result.paths for _ in range(p.copies)))
    assert samples[0] == samples[2]  # a seed reproduces
    assert samples[0] != samples[1]
