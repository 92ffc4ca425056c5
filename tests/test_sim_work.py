"""benchmarks/sim_sensitivity.py `work`: the booked cost model accounts for every simulated second (the two
roles' books add up to the run's clock time, the per-iteration parts are the profile's per-iteration costs
times the iterations), and the batching bounds only take away what batching could remove."""

import sys
from pathlib import Path

import pytest

from specscale.costmodel.hardware import HardwareProfile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sim_sensitivity  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    return sim_sensitivity.work(problems=4, beam_size=4, variants=["beam", "specscale"], workers=1)


def test_the_books_account_for_every_simulated_second(runs):
    hardware = HardwareProfile.load(sim_sensitivity.HARDWARE)
    for run in runs:
        generator, prm = run["generator"], run["prm"]
        assert generator["seconds"] + prm["seconds"] == pytest.approx(run["elapsed_s"], rel=1e-9)
        assert prm["fixed"] + prm["kernels"] == pytest.approx(prm["iterations"] * run["prm_per_call_s"])
        assert generator["fixed"] == pytest.approx(generator["iterations"] * hardware.iteration_fixed_s)
        assert 0 < prm["tokens"] <= prm["input_tokens"] and generator["rows"] >= generator["iterations"] > 0


def test_the_bounds_only_remove_per_call_seconds(runs):
    beam, specscale = (run["ratios"] for run in runs)
    assert beam["measured"] == pytest.approx(1.0)
    for ratios in (beam, specscale):
        assert ratios["no_per_call"] > ratios["measured"]
        assert ratios["no_per_call"] >= ratios["knee_calls"]


def test_the_table_has_a_row_per_variant(runs):
    table = sim_sensitivity.work_markdown(runs, problems=4, beam_size=4)
    rows = [line for line in table.splitlines() if line.startswith("| beam ") or line.startswith("| specscale ")]
    assert len(rows) == 2 and all(row.count("|") == table.splitlines()[2].count("|") for row in rows)
