"""preset_argument: the argparse type of every command's preset option (`solve --preset`, `serve
--default-preset`): a preset or `preset[field=value,...]`, read by the one parser the server's `search.preset`
goes through too (`search/presets.py` `preset_config`). A preset it rejects is a `usage_error.py` `UsageError`: one
line naming the option (`cli.py` prints it), where argparse's own error would print its usage first."""

from __future__ import annotations

from specscale.search.presets import preset_config
from specscale.usage_error import UsageError


def preset_argument(text: str) -> str:
    """The text itself once the parser accepts it (an unknown preset or field: the parser's message)."""
    try:
        preset_config(text)
    except ValueError as error:
        raise UsageError(str(error)) from error
    return text
