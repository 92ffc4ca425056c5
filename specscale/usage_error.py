"""UsageError: what the user asked for cannot run (a model folder that is not there, an unknown preset). Raised by
the checks of a command's arguments (`preset_argument.py`, `specscale_lab/cli_checks.py`), before anything
loads; `cli.py` `main` prints it as `specscale <command>: error: <message>` and returns 2, as argparse does for a
bad option. A leaf module, so that any command's argument types may raise it."""


class UsageError(Exception):
    """One line for the user: what was wrong and what would work."""
