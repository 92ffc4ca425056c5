"""Behaviour identity: every preset in `search/presets.py` runs a small ladder (a few problems, fixed seeds) on
the scripted backend and on the simulator, and the returned paths (token counts, steps, scores, answers,
votes), usage, timings and the run's metrics (PRM calls and batch shapes, virtual time) hash to the value
recorded from the code before the policy refactor (issue 28, point 3). A refactor of the search's policies
must leave this hash unchanged; a deliberate behaviour change updates it, saying why in the commit."""

import hashlib
from dataclasses import asdict

import pytest

from specscale.search.presets import PRESETS, preset_config
from specscale.sim.simulation import Simulation, SimulationConfig
from search_backends import scripted_request, scripted_runtime

PROBLEMS = 3
SETTINGS = dict(beam_size=4, beam_width=2, max_rounds=4, max_step_tokens=48)

# recorded on main at 39c0202 (before the refactor)
EXPECTED = {
    "scripted": "dd8391c87ac089d4d172f34f2884fc75bceb92d2cdfb6d3af93e326c8b9ef47f",
    "simulated": "0052bb30fa970d3a71e8f09b6fa482c280d6fd771710eea0a631373365721b9d",
}


def _digest(records: list) -> str:
    return hashlib.sha256(repr(records).encode()).hexdigest()


def _record(preset: str, results: list, runtime, clock: float) -> tuple:
    return (preset, [asdict(r) for r in results], asdict(runtime.take_metrics()), clock)


def scripted_ladder() -> list:
    records = []
    for preset in sorted(PRESETS):
        runtime = scripted_runtime(max_concurrency=PROBLEMS)
        requests = [scripted_request(i, preset_config(preset, seed=i, **SETTINGS), f"{preset}-{i}")
                    for i in range(PROBLEMS)]
        results = runtime.run(requests)
        records.append(_record(preset, results, runtime, runtime.clock()))
    return records


def simulated_ladder() -> list:
    records = []
    for preset in sorted(PRESETS):
        sim = Simulation(SimulationConfig(seed=0))
        runtime = sim.runtime(max_concurrency=PROBLEMS)
        requests = [sim.request(p, preset_config(preset, seed=i, **SETTINGS), f"{preset}-{i}")
                    for i, p in enumerate(sim.problems(PROBLEMS))]
        results = runtime.run(requests)
        records.append(_record(preset, results, runtime, sim.clock()))
        sim.close()
    return records


@pytest.mark.parametrize("backend,ladder", [("scripted", scripted_ladder), ("simulated", simulated_ladder)])
def test_every_preset_returns_the_paths_and_metrics_it_returned_before(backend, ladder):
    assert _digest(ladder()) == EXPECTED[backend]
