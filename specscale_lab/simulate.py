"""`specscale simulate <benchmark>`: a `specscale bench` sub-command on the simulator (docs/simulator.md).

Each simulated benchmark is the bench sub-command itself, parsed by the same module with the simulator
as its backend and paper-scale defaults (an A100-80GB, Qwen2.5-7B-Instruct + Qwen2.5-Math-PRM-7B, MATH-500);
`specscale simulate throughput ...` and `specscale bench throughput --backend sim ...` run the same code
and write the same raw.json, summary.json (`results[variant][beam_size]`), Markdown and PNG.
"""

from __future__ import annotations

import importlib

SIMULATED_BENCHMARKS = ("throughput", "latency", "sweep_lv", "scaling", "characterize")
SIMULATE_DEFAULTS = {"backend": "sim", "hardware": "a100-80gb", "generator": "qwen2.5-7b-instruct",
                     "prm": "qwen2.5-math-prm-7b"}


def add_simulate(sub) -> None:
    parser = sub.add_parser("simulate", help="the benchmarks on a simulated device and models (docs/simulator.md)")
    commands = parser.add_subparsers(dest="bench_command", required=True)
    for name in SIMULATED_BENCHMARKS:
        module = importlib.import_module(f"specscale_lab.bench.{name}")
        module.add_parser(commands)
        commands.choices[module.NAME].set_defaults(**SIMULATE_DEFAULTS)
