"""One name per setting across commands (issue 45): `--kv-gb` and `--lv-threshold` on every command that takes
them, `--dataset` for which problems; each command's former name still parses into the same setting but `-h`
shows only the new one. `specscale simulate` takes only what a simulation reads."""

from __future__ import annotations

import argparse
import shlex

import pytest

from specscale.cli import build_parser, main
from specscale_lab.bench.outputs import command_line

# (command, the options it needs to parse, new name, former name, value)
RENAMED = [
    (["serve"], [], "--kv-gb", "--generator-kv-gb", "0.5"),
    (["serve"], [], "--lv-threshold", "--lv-threshold-tokens", "256"),
    (["trace"], ["--out", "t.jsonl"], "--dataset", "--task", "gsm8k"),
]
# (command, the options it needs to parse): every command that takes the KV pool and the LV threshold
KV_AND_LV = [(["serve"], []), (["trace"], ["--out", "t.jsonl"]), (["eval"], ["--dataset", "gsm8k"]),
             (["bench", "throughput"], ["--out", "o"]), (["simulate", "throughput"], [])]
REAL_HARDWARE = ("--device", "--kernels", "--backend", "--dtype", "--kv-gb", "--prm-kv-gb", "--profile-prm")
SIMULATED = ("throughput", "latency", "sweep-lv", "scaling", "characterize")


def command_parser(words: list[str]) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in words:
        parser = next(action for action in parser._actions
                      if isinstance(action, argparse._SubParsersAction)).choices[word]
    return parser


def help_text(words: list[str]) -> str:
    return command_parser(words).format_help()


@pytest.mark.parametrize(("command", "needed", "new", "former", "value"), RENAMED)
def test_the_new_name_and_the_former_one_set_the_same_setting_and_help_shows_the_new_one(command, needed, new,
                                                                                         former, value):
    parser = command_parser(command)
    by_new, by_former, unset = (parser.parse_args(options + needed) for options in ([new, value], [former, value], []))
    assert vars(by_new) == vars(by_former) != vars(unset)
    text = help_text(command)
    assert f"{new} " in text and former not in text


@pytest.mark.parametrize(("command", "needed"), KV_AND_LV)
def test_every_command_names_the_kv_pool_and_the_lv_threshold_alike(command, needed):
    text = help_text(command)
    assert "--lv-threshold " in text and "--lv-threshold-tokens" not in text and "--generator-kv-gb" not in text
    if command[0] != "simulate":
        assert "--kv-gb " in text


@pytest.mark.parametrize("benchmark", SIMULATED)
def test_simulate_shows_no_real_hardware_option_and_says_its_problems_are_simulated(benchmark):
    parser = command_parser(["simulate", benchmark])
    text = help_text(["simulate", benchmark])
    assert not [flag for flag in REAL_HARDWARE if f"{flag} " in text or f"{flag}]" in text], text
    assert parser.parse_args([]).backend == parser.parse_args(["--backend", "sim"]).backend == "sim"  # run records
    if benchmark != "scaling":  # scaling sweeps concurrency, not problems
        assert "simulated problems per run" in " ".join(text.split()) and "toy test problems" not in text


@pytest.mark.parametrize("option", [["--device", "cuda"], ["--kernels", "auto"], ["--backend", "real"],
                                    ["--kv-gb", "1"], ["--no-profile-prm"]])
def test_simulate_refuses_a_real_hardware_option_in_one_line(option, capsys):
    assert main(["simulate", "latency", *option]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"specscale simulate latency: error: {option[0]}"), lines


def test_bench_keeps_the_real_hardware_options():
    text = help_text(["bench", "throughput"])
    assert all(f"{flag} " in text for flag in REAL_HARDWARE)


def test_a_recorded_simulate_command_parses_back_to_the_same_settings():
    """A simulated run records `--backend sim` (its namespace holds it): simulate accepts that one backend."""
    args = build_parser().parse_args(["simulate", "throughput", "--quick", "--beam-sizes", "4"])
    recorded = shlex.split(command_line("throughput", args, "specscale simulate"))
    again = build_parser().parse_args(recorded[1:])
    assert {k: v for k, v in vars(again).items() if k != "func"} == {k: v for k, v in vars(args).items() if k != "func"}


def test_bench_takes_engine_as_solves_name_for_its_real_backend():
    from specscale.cli import build_parser

    for name in ("engine", "real"):
        assert build_parser().parse_args(["bench", "throughput", "--backend", name, "--out", "x"]).backend == "real"
