"""A command a newcomer gets wrong fails in one line, before any model loads (issue 45): a model path that is
not a model folder names its flag and what it expected, an unknown preset lists the valid ones, both with
argparse's exit status 2; a failed `eval` start leaves nothing that refuses the corrected rerun."""

from __future__ import annotations

import argparse

import pytest

from specscale.cli import UsageError, main
from specscale.search.presets import PRESETS
from specscale_lab.cli_checks import check_model_folders, known_variants
from specscale_lab.evaluation.results import SETTINGS, ResultsFolder


def one_error_line(capsys, command: str) -> str:
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{command}: error: "), stderr
    return lines[0]


def test_generate_with_a_bad_model_folder_fails_in_one_line(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "missing")]) == 2
    assert "--model" in one_error_line(capsys, "specscale generate")
    assert main(["generate", "--model", str(tmp_path)]) == 2  # a folder, but no config.json
    assert "has no config.json" in one_error_line(capsys, "specscale generate")


def test_solve_can_check_its_model_folders_before_loading(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    check_model_folders(argparse.Namespace(generator=str(tmp_path), prm=str(tmp_path)))
    for flag, generator, prm in (("--generator", "/nonexistent/model", str(tmp_path)),
                                 ("--prm", str(tmp_path), "/nonexistent/prm")):
        with pytest.raises(UsageError, match=f"^{flag} /nonexistent/.*expected a model folder with config.json"):
            check_model_folders(argparse.Namespace(generator=generator, prm=prm))


def test_solve_with_a_bad_model_folder_fails_in_one_line(capsys):
    assert main(["solve", "--generator", "/nonexistent/model"]) == 2
    assert "--generator /nonexistent/model" in one_error_line(capsys, "specscale solve")
    assert main(["solve", "--beam-size", "-4", "--problems", "1"]) == 2
    assert "beam_size" in one_error_line(capsys, "specscale solve")
    assert main(["solve", "--question", "  "]) == 2
    assert "--question" in one_error_line(capsys, "specscale solve")


@pytest.mark.parametrize("command", [["simulate", "throughput"], ["bench", "latency", "--out", "unused"]])
def test_an_unknown_variant_lists_the_valid_presets(command, capsys):
    assert main([*command, "--variants", "beam,specscale[lv_max_deferrals=3],nope"]) == 2
    line = one_error_line(capsys, "specscale " + " ".join(command[:2]))
    assert "unknown preset(s) nope;" in line and all(name in line for name in PRESETS)


def test_known_variants_keeps_fields_in_brackets():
    assert known_variants("beam,specscale[lv_max_deferrals=3,lv_sibling_trigger=false]") == [
        "beam", "specscale[lv_max_deferrals=3,lv_sibling_trigger=false]"]


def test_eval_with_missing_models_fails_in_one_line_and_the_corrected_rerun_may_use_its_folder(tmp_path, capsys):
    out = tmp_path / "eval"
    command = ["eval", "--dataset", "gsm8k", "--problems", "1", "--out", str(out)]
    assert main([*command, "--generator", str(tmp_path / "no-generator"), "--prm", str(tmp_path / "no-prm")]) == 2
    assert "--generator" in one_error_line(capsys, "specscale eval")
    assert not (out / SETTINGS).exists()


def test_a_results_folder_holds_its_settings_from_its_first_result_on(tmp_path):
    ResultsFolder(tmp_path, {"generator": "wrong"})  # a start that failed before any search finished
    folder = ResultsFolder(tmp_path, {"generator": "right"})
    folder.add_record({"preset": "beam", "seed": 0, "problem_id": "p0"})
    with pytest.raises(SystemExit, match="other settings"):
        ResultsFolder(tmp_path, {"generator": "wrong"})


def test_a_variant_with_an_unknown_field_fails_in_one_line(capsys):
    assert main(["simulate", "throughput", "--variants", "specscale[no_such_field=1]"]) == 2
    assert "no_such_field" in one_error_line(capsys, "specscale simulate throughput")


@pytest.mark.parametrize(("command", "flags", "named"), [
    (["bench", "throughput", "--out", "unused"], ["--beam-sizes", "-4"], "--beam-sizes -4"),
    (["simulate", "throughput"], ["--beam-sizes", "8", "--beam-width", "3"], "--beam-sizes 8 --beam-width 3"),
    (["simulate", "scaling"], ["--max-rounds", "0"], "--max-rounds 0"),
    (["eval", "--dataset", "gsm8k", "--problems", "1"], ["--beam-size", "-4"], "--beam-size -4"),
    (["eval", "--dataset", "gsm8k", "--preset", "beam,dvts"], ["--beam-size", "8", "--beam-width", "3"],
     "--beam-size 8 --beam-width 3"),
    (["trace", "--out", "unused.jsonl"], ["--beam-size", "-4"], "--beam-size -4"),
])
def test_bad_search_values_fail_in_one_line_naming_their_flags(command, flags, named, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # nothing is written: the check comes before anything loads or opens a folder
    assert main([*command, *flags]) == 2
    line = one_error_line(capsys, " ".join(["specscale", *(word for word in command[:2] if not word.startswith("-"))]))
    assert f"{named}: beam_size" in line or f"{named}: max_rounds" in line, line
    assert not list(tmp_path.iterdir())
