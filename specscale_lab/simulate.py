"""`specscale simulate <benchmark>`: a `specscale bench` sub-command on the simulator (docs/simulator.md).

Each simulated benchmark is the bench sub-command itself, parsed by the same module with the simulator
as its backend and paper-scale defaults (an A100-80GB, Qwen2.5-7B-Instruct + Qwen2.5-Math-PRM-7B, MATH-500);
`specscale simulate throughput ...` and `specscale bench throughput --backend sim ...` run the same code
and write the same raw.json, summary.json (`results[variant][beam_size]`), Markdown and PNG, by default
into `results/simulate-<benchmark>` (`--out` names another folder).
"""

from __future__ import annotations

import importlib

from specscale_lab.bench.arguments import SimulationParser
from specscale_lab.cli_checks import check_variants_option

SIMULATED_BENCHMARKS = ("throughput", "latency", "sweep_lv", "scaling", "characterize")
SIMULATE_DEFAULTS = {"backend": "sim", "hardware": "a100-80gb", "generator": "qwen2.5-7b-instruct",
                     "prm": "qwen2.5-math-prm-7b"}
OUT_OPTION = "--out"
SHOWN_DEFAULTS = ("--hardware", "--generator", "--prm")  # their help says no default: simulate's are its own


def add_simulate(sub) -> None:
    """The bench modules' parsers, built as `SimulationParser`s: no real-hardware option (`--device`,
    `--kernels`, `--backend`, ...), the simulated problems, the paper-scale defaults said in `-h`."""
    parser = sub.add_parser("simulate", help="the benchmarks on a simulated device and models (docs/simulator.md)")
    commands = parser.add_subparsers(dest="bench_command", required=True, parser_class=SimulationParser)
    for name in SIMULATED_BENCHMARKS:
        module = importlib.import_module(f"specscale_lab.bench.{name}")
        module.add_parser(commands)
        parser = commands.choices[module.NAME]
        parser.set_defaults(**SIMULATE_DEFAULTS)
        for option in SHOWN_DEFAULTS:
            say_default(parser, option)
        default_out(parser, f"results/simulate-{module.NAME}")
        check_variants_option(parser)


def say_default(parser, option: str) -> None:
    """Append the simulate default of `option` to its help (argparse's table of options is read: no public way)."""
    action = parser._option_string_actions[option]
    action.help = f"{action.help} (default: {parser.get_default(action.dest)})"


def default_out(parser, folder: str) -> None:
    """`--out` optional, `folder` when not given (the bench parsers require it: their runs are measurements
    worth naming). argparse offers no public way to reach an added option: its table of them is read."""
    action = parser._option_string_actions[OUT_OPTION]
    action.required, action.default = False, folder
    action.help = f"{action.help} (default: {folder})"
