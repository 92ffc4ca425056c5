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
    from specscale_lab.bench.arguments import search_settings
    from specscale_lab.evaluation.command import search_config

    bench = build_parser().parse_args(["bench", "throughput", "--out", "x", "--filter-duplicates"])
    assert search_settings(bench, 8)["filter_duplicates"] is True
    plain = build_parser().parse_args(["bench", "accuracy", "--out", "x"])
    assert "filter_duplicates" not in search_settings(plain, 8)  # unset: the preset's own value stands
    asked = build_parser().parse_args(["eval", "--dataset", "gsm8k", "--filter-duplicates"])
    assert search_config(asked, "beam", seed=0).filter_duplicates
    assert not search_config(build_parser().parse_args(["eval", "--dataset", "gsm8k"]), "beam", seed=0).filter_duplicates


def test_search_flags_left_unset_keep_the_presets_own_values():
    """solve, bench, eval and trace override a preset only with the flags a user gave: best-of-n keeps its one
    round, and a preset's fields set in brackets stand."""
    from specscale.search.presets import preset_config
    from specscale_lab.bench.arguments import given_search_flags
    from specscale_lab.evaluation.command import search_config

    solve = build_parser().parse_args(["solve", "--preset", "best-of-n"])
    assert given_search_flags(solve) == {} and preset_config(solve.preset, **given_search_flags(solve)).max_rounds == 1
    asked = build_parser().parse_args(["solve", "--beam-size", "4", "--max-rounds", "3"])
    assert given_search_flags(asked) == {"beam_size": 4, "max_rounds": 3}
    evaluation = build_parser().parse_args(["eval", "--dataset", "gsm8k", "--preset", "best-of-n"])
    assert search_config(evaluation, "best-of-n", seed=0).max_rounds == 1
    trace = build_parser().parse_args(["trace", "--out", "x.jsonl"])
    assert given_search_flags(trace) == {}


def test_every_command_takes_a_preset_with_fields_and_refuses_a_bad_one_in_one_line(capsys):

    assert build_parser().parse_args(["solve", "--preset", "specscale[lv_max_deferrals=3]"]).preset \
        == "specscale[lv_max_deferrals=3]"
    assert build_parser().parse_args(["serve", "--default-preset", "beam[filter_duplicates=true]"]).default_preset \
        == "beam[filter_duplicates=true]"
    from specscale.cli import main

    for argv, fragment in ((["solve", "--preset", "greedy"], "unknown preset"),
                           (["serve", "--default-preset", "specscale[speed=11]"], "no field")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert fragment in err and len(err.strip().splitlines()) == 1 and "usage:" not in err


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
