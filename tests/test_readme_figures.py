"""The README's figures about the bundled models are the model card's (docs/toy-models.md), so the two
cannot drift apart when the models are retrained."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def card_figure(label: str) -> str:
    """The bold or plain figure in the model card's table row whose label starts with `label`."""
    for line in (ROOT / "docs" / "toy-models.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith(label):
            return re.match(r"\**([\d.]+%?)", cells[1]).group(1)
    raise AssertionError(f"the model card has no row {label!r}")


def test_the_readme_quotes_the_model_cards_figures():
    readme = (ROOT / "README.md").read_text()
    intro = readme[: readme.index("## The two commands")]
    quoted = {
        "per sample": card_figure("single-sample accuracy"),
        "pass@8": card_figure("pass@8"),
        "within-problem AUC": card_figure("PRM within-problem step AUC"),
        "solves": card_figure("synchronous PRM beam search N = 8"),
    }
    assert re.search(rf"{re.escape(quoted['per sample'])} per sample", intro)
    assert re.search(rf"{re.escape(quoted['pass@8'])} pass@8", intro)
    assert re.search(rf"within-problem AUC {re.escape(quoted['within-problem AUC'])}", intro)
    assert re.search(rf"solves {re.escape(quoted['solves'])}", intro)
