"""The lab's `specscale` sub-commands, added through the CLI's plugin seam (the entry point group
`specscale.commands` in pyproject.toml; `specscale/cli.py` explains the seam)."""

from __future__ import annotations

from specscale_lab.bench import add_bench
from specscale_lab.cli_checks import check_variants_option, subcommand_parsers
from specscale_lab.evaluation.command import add_eval
from specscale_lab.generate import add_generate
from specscale_lab.record_trace import add_trace
from specscale_lab.simulate import add_simulate
from specscale_lab.solve import add_solve


def add_commands(sub) -> None:
    add_generate(sub)
    add_solve(sub)
    add_bench(sub)
    for parser in subcommand_parsers(sub.choices["bench"]):
        check_variants_option(parser)
    add_eval(sub)
    add_simulate(sub)
    add_trace(sub)
