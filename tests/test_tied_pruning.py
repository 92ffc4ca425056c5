"""The tie-aware strict threshold (`search/pruning.py` `TiedStrictPruning`, preset `ep-strict+ties`): a new
search variant as one policy class and one preset line. It retains in every round exactly what `beam`
retains, ties and exact 1.0 scores included, and cancels tied candidates that `ep-strict` keeps alive."""

import pytest

from specscale.search.presets import preset_config
from specscale.search.pruning import TiedStrictPruning
from specscale.search.search import Search
from test_search import decisions, decisions_of, logical_paths, run_preset, two_choice_step

MANY_TIES = dict(score_levels=4, perfect_rate=0.3)


def test_the_preset_is_the_strict_preset_with_the_tie_aware_policy():
    search = Search(preset_config("ep-strict+ties"))
    assert type(search.pruning) is TiedStrictPruning and search.speculation.eager_depth == 1
    assert preset_config("ep-strict+ties").pruning == "strict_ties"


@pytest.mark.parametrize("scores", [dict(), MANY_TIES], ids=["few-ties", "many-ties"])
@pytest.mark.parametrize("n,m", [(8, 4), (4, 4), (16, 4), (8, 2)])
def test_it_retains_what_beam_retains(n, m, scores):
    found = {preset: decisions(run_preset(preset, n_requests=3, beam_size=n, beam_width=m, **scores)[0])
             for preset in ("beam", "ep-strict+ties")}
    assert found["beam"] == found["ep-strict+ties"]
    assert any(len(rounds) > 2 for rounds in found["beam"].values())  # the test has depth


@pytest.mark.parametrize("step_fn", [None, two_choice_step], ids=["distinct-steps", "repeated-steps"])
def test_with_cd_it_follows_beam_with_cd_round_for_round(step_fn):
    plain, plain_results = run_preset("beam+cd", step_fn=step_fn, **MANY_TIES)
    tied, tied_results = run_preset("ep-strict+ties[dedup=true]", step_fn=step_fn, **MANY_TIES)
    for rid in plain.finished_ids():
        assert decisions_of(tied, rid) == decisions_of(plain, rid)
    for a, b in zip(plain_results, tied_results, strict=True):
        assert logical_paths(a) == logical_paths(b)


def test_with_filter_duplicates_it_is_the_strict_rule():
    found = {preset: decisions(run_preset(preset, step_fn=two_choice_step, filter_duplicates=True, **MANY_TIES)[0])
             for preset in ("beam", "ep-strict+ties")}
    assert found["beam"] == found["ep-strict+ties"]


def test_it_cancels_ties_that_strict_pruning_keeps():
    strict, _ = run_preset("ep-strict", n_requests=3, **MANY_TIES)
    tied, _ = run_preset("ep-strict+ties", n_requests=3, **MANY_TIES)
    assert sum(tied.generator.rows_per_step) < sum(strict.generator.rows_per_step)
    strict_usage = sum(strict.result(rid).usage.wasted_tokens for rid in strict.finished_ids())
    tied_usage = sum(tied.result(rid).usage.wasted_tokens for rid in tied.finished_ids())
    assert tied_usage < strict_usage


def test_an_unknown_policy_name_is_refused_when_the_config_is_built():
    with pytest.raises(ValueError, match="pruning must be one of"):
        preset_config("ep-strict[pruning=sloppy]")
    with pytest.raises(ValueError, match="speculation must be one of"):
        preset_config("beam[speculation=reckless]")
