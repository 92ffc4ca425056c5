"""Where the bundled toy checkpoints live inside the installed package."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TOY_GENERATOR = ASSETS / "toy-generator"
TOY_PRM = ASSETS / "toy-prm"
