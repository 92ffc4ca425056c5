"""preset_argument: the argparse type of every command's preset option (`solve --preset`, `serve
--default-preset`): a preset or `preset[field=value,...]`, read by the one parser the server's `search.preset`
goes through too (`search/presets.py` `preset_config`). A preset it rejects is argparse's one-line error."""

from __future__ import annotations

import argparse

from specscale.search.presets import preset_config


def preset_argument(text: str) -> str:
    """The text itself once the parser accepts it (an unknown preset or field: the parser's message)."""
    try:
        preset_config(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    return text
