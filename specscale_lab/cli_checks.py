"""Checks of a lab command's arguments, made before anything loads, each failing with one line that names
the flag and what it expected.

- `check_model_folders(args)` reads a Hugging Face Hub id in `--generator` / `--prm` as its cached snapshot
  folder; `check_model_folder(flag, folder)` raises `specscale.cli.UsageError`, which `specscale/cli.py`'s `main`
  prints as `specscale <command>: error: <message>` with exit status 2;
- `known_variants` is an argparse `type=` for `--variants` / `--presets` that raises the same (argparse
  passes it on: it would print its whole usage before an error of its own type);
  `check_variants_option(parser)` puts it on a parser that has the option;
- `check_search_settings(preset, flags)` (solve, eval, trace) and `check_sweep_settings` (every search of a
  bench or simulate sweep) apply SearchConfig's own rules to the preset with the flags given.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from specscale.checkpoint_source import resolve_checkpoint
from specscale.search.presets import PRESETS, preset_config, split_variants
from specscale.usage_error import UsageError

MODEL_CONFIG = "config.json"
VARIANTS_OPTION = "--variants"
SWEEP_FLAG_NAMES = {"beam_size": "--beam-sizes"}  # a bench sweeps beam sizes


def check_model_folder(flag: str, folder: str | Path) -> None:
    """A local Hugging Face model folder: one holding config.json."""
    if not (Path(folder) / MODEL_CONFIG).is_file():
        raise UsageError(f"{flag} {folder}: expected a model folder with {MODEL_CONFIG} "
                         f"({model_folder_problem(Path(folder))})")


def model_folder_problem(folder: Path) -> str:
    if not folder.exists():
        return "no such file or folder"
    if not folder.is_dir():
        return "it is a file"
    return f"the folder has no {MODEL_CONFIG}"


def check_model_folders(args) -> None:
    """`--generator` and `--prm` of a command that loads both models; a Hugging Face Hub id in either is replaced
    by its snapshot folder in the Hugging Face cache (`specscale/checkpoint_source.py`)."""
    args.generator = resolve_checkpoint("--generator", str(args.generator))
    args.prm = resolve_checkpoint("--prm", str(args.prm))
    check_model_folder("--generator", args.generator)
    check_model_folder("--prm", args.prm)


def known_variants(text: str) -> list[str]:
    """Comma-separated variants (`split_variants`), each a preset, or a preset with SearchConfig fields
    changed that `preset_config` accepts."""
    variants = split_variants(text)
    unknown = [variant for variant in variants if variant_name(variant) not in PRESETS]
    if unknown:
        raise UsageError(f"--variants {text}: unknown preset(s) {', '.join(unknown)}; "
                         f"valid presets: {', '.join(sorted(PRESETS))}")
    for variant in variants:
        check_variant_fields(variant)
    return variants


def check_variant_fields(variant: str) -> None:
    try:
        preset_config(variant)
    except ValueError as error:
        raise UsageError(f"--variants {variant}: {error}") from None


def variant_name(variant: str) -> str:
    """The preset a variant names: its text before any `[field=value,...]`."""
    return variant.partition("[")[0].strip()


def check_variants_option(parser: argparse.ArgumentParser) -> None:
    """Give the parser's `--variants` option the `known_variants` check (parsers without one are left
    as they are). argparse offers no public way to reach an added option: its table of them is read."""
    action = parser._option_string_actions.get(VARIANTS_OPTION)
    if action is not None:
        action.type = known_variants


def subcommand_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of a command's sub-commands (`specscale bench throughput`, ...)."""
    return [choice for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for choice in action.choices.values()]


def check_search_settings(preset: str, flags: dict, flag_names: dict[str, str] | None = None) -> None:
    """The search a preset and the user's search flags make up is valid (SearchConfig's own checks), before
    any model loads: one line naming the flags the error is about otherwise (`--beam-size -4`: "beam_size
    must be >= 1"). flag_names: the flag of a field where it is not `--<field>` (a bench's `--beam-sizes`)."""
    try:
        preset_config(preset, **flags)
    except ValueError as error:
        given = flags_text(named_flags(flags, str(error)), flag_names or {})
        raise UsageError(f"{given}: {error}" if given else str(error)) from None


def check_sweep_settings(variants: list[str], beam_sizes: list[int], flags: dict) -> None:
    """Every search of a bench sweep: each variant at each beam size, with the user's other search flags."""
    for variant in variants:
        for beam_size in beam_sizes:
            try:
                check_search_settings(variant, {"beam_size": beam_size, **flags}, SWEEP_FLAG_NAMES)
            except UsageError as error:
                raise UsageError(f"preset {variant}, {error}") from None


def named_flags(flags: dict, error: str) -> dict:
    """The flags whose SearchConfig field the error names (all of them when it names none)."""
    named = {name: value for name, value in flags.items() if re.search(rf"\b{name}\b", error)}
    return named or flags


def flags_text(flags: dict, flag_names: dict[str, str]) -> str:
    return " ".join(f"{flag_names.get(name, option_of(name))} {value}" for name, value in flags.items())


def option_of(field: str) -> str:
    """`beam_size` -> `--beam-size`."""
    return "--" + field.replace("_", "-")


def non_empty_question(text: str) -> str:
    """An argparse type for `--question`: a question with some text (the server refuses an empty one too)."""
    if not text.strip():
        raise UsageError("--question: a question must have some text")
    return text
