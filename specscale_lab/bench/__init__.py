"""`specscale bench <sub-command>`: the evaluation, reproduced on the bundled models.

Each sub-command lives in its own module exposing `add_parser(subparsers)`; they are registered in
`SUBCOMMANDS` (module names under specscale_lab.bench) and imported lazily.
"""

from __future__ import annotations

import importlib

SUBCOMMANDS: list[str] = ["throughput", "latency", "accuracy", "characterize", "sweep_lv", "scaling", "serve"]


def add_bench(sub) -> None:
    parser = sub.add_parser("bench", help="benchmarks on the bundled models (see docs/BENCHMARKS.md)")
    commands = parser.add_subparsers(dest="bench_command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"specscale_lab.bench.{name}").add_parser(commands)
