"""benchmarks/sim_validation.py: the simulated side of a real bench run (its settings parsed back from the
command it recorded), the open-loop driver on the virtual clock, the table, and the workload fit's pieces."""

import importlib.util
import math
from pathlib import Path

import pytest

from specscale.sim.workload import TOY
from specscale_lab.calibration.trace import TraceRequest, TraceStep

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sim_validation.py"
spec = importlib.util.spec_from_file_location("sim_validation", SCRIPT)
sim_validation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim_validation)

COMMAND = ("specscale bench {name} --beam-sizes 4 --beam-width 4 --max-concurrency 2 --max-rounds 3 --out x "
           "--problems 3 --repeats 1 --seed 0 --variants beam,specscale")


def real_summary(name: str, results: dict, **extra) -> dict:
    return {"run": {"command": COMMAND.format(name=name), "lv_threshold_tokens": 512, "spare_rows": 32},
            "results": results, **extra}


def test_the_simulated_cells_are_the_real_runs_cells_and_the_table_compares_them():
    real = real_summary("throughput", {v: {"4": {"output_tokens_per_s": 1000.0, "requests_per_s": 1.0}}
                                       for v in ("beam", "specscale")})
    real["results"]["specscale"]["4"]["output_tokens_per_s"] = 2000.0
    simulated = sim_validation.simulate_throughput("cpu", TOY, real, seed=0)
    assert set(simulated) == {"beam", "specscale"} and set(simulated["beam"]) == {"4"}
    cell = simulated["beam"]["4"]
    assert cell["output_tokens"] > 0 and cell["elapsed_s"] > 0
    assert cell["output_tokens_per_s"] == pytest.approx(cell["output_tokens"] / cell["elapsed_s"])
    rows = sim_validation.throughput_rows(real, simulated)
    first = next(r for r in rows if r["cell"] == "beam N=4 output tok/s")
    assert first["error"] == pytest.approx(cell["output_tokens_per_s"] / 1000.0 - 1)
    [order] = sim_validation.ordering(real, simulated)
    assert order["real"] == ["specscale", "beam"]
    swapped = simulated["specscale"]["4"]["output_tokens_per_s"] < cell["output_tokens_per_s"]
    assert bool(order["swapped_pairs"]) == swapped
    assert "cells within ±15%" in sim_validation.report(rows, [], [], [order])


def test_open_loop_requests_arrive_on_the_virtual_clock():
    real = real_summary("latency", {}, rates=[0.01, 1000.0], burstiness=1.0)
    simulated = sim_validation.simulate_latency("cpu", TOY, real, seed=0)
    slow, fast = simulated["beam"]["4"]["rates"]
    assert (slow["rate"], fast["rate"]) == (0.01, 1000.0)
    # all at once, two in flight: the third request queues; a hundred seconds apart, none does
    assert slow["mean_queued_s"] == 0.0 and fast["mean_queued_s"] > 0.0
    assert fast["p90_s"] > slow["p50_s"] > 0


def test_sibling_step_sigma_is_the_spread_within_a_requests_kth_steps():
    def step(i, lengths):
        return TraceStep(i, None, 0, lengths, ())

    # step 0: lengths 10 and 40 (log spread ln 4 / 2 each side); step 1: 20 and 20 (none)
    request = TraceRequest("r", "q", 5, 9, None, None, None, (step(0, (10, 20)), step(1, (40, 20))))
    other = TraceRequest("s", "q", 5, 9, None, None, None, (step(0, (7,)),))  # alone: no group
    expected = math.sqrt(2 * (math.log(4) / 2) ** 2 / (4 - 2))
    assert sim_validation.sibling_step_sigma([request, other]) == pytest.approx(expected)
    assert sim_validation.sibling_step_sigma([other]) == TOY.step_tokens_sigma


def test_sibling_steps_sigma_is_the_spread_of_steps_per_solution_within_a_request():
    """The simulated generator draws a path's step count around its problem's median (the levels spread the
    problems); fitted over every solution, the spread drew siblings of very different lengths, and beam
    search, which keeps its first N completed paths, returned the short ones."""
    def sample(i, steps, completed=True):
        return TraceStep(i, None, 0, (20,) * steps, (), completed=completed)

    # one request: 2 and 8 steps (log spread ln 4 / 2 each side), plus an unfinished sample that does not count;
    # another: 3 and 3 steps (none); a problem of 30 steps alone adds spread between problems, not within
    first = TraceRequest("r", "q", 5, 9, None, None, None, (sample(0, 2), sample(1, 8), sample(2, 30, False)))
    second = TraceRequest("s", "q", 5, 9, None, None, None, (sample(0, 3), sample(1, 3)))
    alone = TraceRequest("t", "q", 5, 9, None, None, None, (sample(0, 30),))
    expected = math.sqrt(2 * (math.log(4) / 2) ** 2 / (4 - 2))
    assert sim_validation.sibling_steps_sigma([first, second, alone]) == pytest.approx(expected)
    assert sim_validation.sibling_steps_sigma([alone]) == TOY.steps_sigma
