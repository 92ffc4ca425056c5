"""`eval` and `bench` name their list of presets alike (issue 45): `--presets` on both (bench's `--variants`
stays its other visible name), eval's former `--preset` still parses into the same setting but `-h` shows only
`--presets`; a recorded eval command line names `--presets` and its `--dataset` (bench's recording left the
dataset out) and parses back to the same settings."""

from __future__ import annotations

import re
import shlex

from specscale.cli import build_parser
from specscale_lab.evaluation.command import recorded_run
from test_cli_names import command_parser


def test_eval_and_bench_take_presets_alike():
    evaluation = build_parser().parse_args(["eval", "--dataset", "gsm8k", "--presets", "beam,specscale[lv_max_deferrals=3]"])
    bench = build_parser().parse_args(["bench", "throughput", "--out", "o", "--presets", "beam,specscale[lv_max_deferrals=3]"])
    assert evaluation.presets == bench.variants == ["beam", "specscale[lv_max_deferrals=3]"]


def test_evals_former_preset_flag_parses_into_the_same_setting_hidden_from_help():
    former = build_parser().parse_args(["eval", "--dataset", "gsm8k", "--preset", "beam,dvts"])
    assert former.presets == ["beam", "dvts"]
    assert build_parser().parse_args(["eval", "--dataset", "gsm8k"]).presets == ["specscale"]  # the default stands
    help_text = command_parser(["eval"]).format_help()
    assert "--presets" in help_text and not re.search(r"--preset\b(?!s)", help_text), help_text


def test_a_recorded_eval_command_names_presets_and_its_dataset_and_parses_back():
    args = build_parser().parse_args(["eval", "--dataset", "gsm8k", "--preset", "beam,specscale"])
    recorded = recorded_run(args)["command"]
    assert recorded.startswith("specscale eval --dataset gsm8k ") and "--presets beam,specscale" in recorded
    again = build_parser().parse_args(shlex.split(recorded)[1:])
    assert (again.dataset, again.presets) == ("gsm8k", ["beam", "specscale"])
