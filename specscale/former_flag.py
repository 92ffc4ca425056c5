"""A flag's former name: still parsed, into the same dest as the flag that replaced it, but hidden from `-h` and
never a default of its own (so the new flag's default stands when neither is given). Every command names a
setting the same way (`--kv-gb`, `--lv-threshold`, `--dataset`); the names a command had before stay working."""

from __future__ import annotations

import argparse


def add_former_name(parser, former: str, flag: argparse.Action) -> None:
    """`former` parses as `flag` (an action `add_argument` returned) does, into its dest."""
    parser.add_argument(former, dest=flag.dest, type=flag.type, choices=flag.choices, default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
