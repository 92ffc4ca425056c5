"""The search options this issue added reach the search from the API and the CLI: filter_duplicates
(docs/design.md, "Duplicate filtering"), off unless asked."""

from specscale.cli import build_parser
from test_server_units import builder, chat  # noqa: F401  (builder is a fixture)


def test_the_api_maps_filter_duplicates_onto_the_search(builder):  # noqa: F811
    asked = builder.chat(chat(search={"preset": "beam", "filter_duplicates": True}), "a").request.config
    default = builder.chat(chat(search={"preset": "beam"}), "b").request.config
    assert asked.filter_duplicates and not default.filter_duplicates


def test_solve_takes_filter_duplicates():
    args = build_parser().parse_args(["solve", "--preset", "dvts", "--filter-duplicates"])
    assert args.filter_duplicates and not build_parser().parse_args(["solve"]).filter_duplicates


def test_bench_and_eval_take_filter_duplicates():
    """Every bench sub-command and eval pass the flag on to each search's config."""
    from specscale_lab.bench.common import search_settings
    from specscale_lab.evaluation.command import search_config

    bench = build_parser().parse_args(["bench", "throughput", "--out", "x", "--filter-duplicates"])
    assert search_settings(bench, 8)["filter_duplicates"] is True
    plain = build_parser().parse_args(["bench", "accuracy", "--out", "x"])
    assert search_settings(plain, 8)["filter_duplicates"] is False
    asked = build_parser().parse_args(["eval", "--dataset", "gsm8k", "--filter-duplicates"])
    assert search_config(asked, "beam", seed=0).filter_duplicates
    assert not search_config(build_parser().parse_args(["eval", "--dataset", "gsm8k"]), "beam", seed=0).filter_duplicates


# ---- variants written as preset[field=value,...] ------------------------------------------------------------
def test_a_variant_may_change_search_config_fields_of_its_preset():
    from specscale.search.presets import parse_variant, preset_config, split_variants

    assert parse_variant("specscale") == ("specscale", {})
    assert parse_variant("specscale[lv_sibling_trigger=false, lv_max_age_s=1.5, lv_max_deferrals=3]") == (
        "specscale", {"lv_sibling_trigger": False, "lv_max_age_s": 1.5, "lv_max_deferrals": 3})
    config = preset_config("beam+cd[verification=lazy_round]", beam_size=4)
    assert config.verification == "lazy_round" and config.dedup and config.beam_size == 4
    assert split_variants("beam, specscale[lv_max_deferrals=3,lv_sibling_trigger=false],ep") == [
        "beam", "specscale[lv_max_deferrals=3,lv_sibling_trigger=false]", "ep"]


def test_a_variant_with_an_unknown_field_or_a_bad_bracket_is_refused():
    import pytest

    from specscale.search.presets import preset_config

    for variant, message in (("specscale[speed=11]", "no field"), ("specscale[lv_max_deferrals]", "field=value"),
                             ("specscale[lv_max_deferrals=3", "expected"), ("nope[dedup=true]", "unknown preset")):
        with pytest.raises(ValueError, match=message):
            preset_config(variant)
