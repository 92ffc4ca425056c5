"""Behaviour identity: every preset in `search/presets.py` runs a small ladder (a few problems, fixed seeds) on
the scripted backend and on the simulator, and the returned paths (token counts, steps, scores, answers,
votes), usage, timings and the run's metrics (PRM calls and batch shapes, virtual time) hash, preset by
preset, to the digest recorded for it in `tests/data/behaviour_digests.json` (issue 28, point 3; issue 43).

Nobody edits that file by hand:
- a preset with no recorded digest (a new one) is recorded by the test run, which says so: commit the file
  with the preset;
- a preset no longer in PRESETS loses its digests the same way;
- a recorded digest that changes fails. A refactor must leave every digest unchanged; a deliberate behaviour
  change re-records with `SPECSCALE_RECORD_BEHAVIOUR=1 python -m pytest tests/test_behaviour_hash.py`, and its
  commit says why (the other presets' digests must not move).

History of the recorded digests (first recorded on main at 39c0202, before the policy refactor): beam+cd+lv
changed (its steps go through the lazy queue as they finish, with every fixed trigger), specscale-nospec (issue
31's all-but-speculation control) and ep-strict+ties (issue 28's one-class variant) were added; every simulated
digest changed once more with the GPU cost model measured on an H200 (issue 31, point 3: the virtual clock's
timings move, the search code does not; the scripted digests stand)."""

import hashlib
import json
import os
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest

from search_backends import scripted_request, scripted_runtime
from specscale.search.presets import PRESETS, preset_config
from specscale.sim.simulation import Simulation, SimulationConfig

PROBLEMS = 3
SETTINGS = dict(beam_size=4, beam_width=2, max_rounds=4, max_step_tokens=48)
DIGESTS = Path(__file__).parent / "data" / "behaviour_digests.json"
RECORD_VARIABLE = "SPECSCALE_RECORD_BEHAVIOUR"


def _digest(record: tuple) -> str:
    return hashlib.sha256(repr([record]).encode()).hexdigest()


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
    check_digests(DIGESTS, backend, {record[0]: _digest(record) for record in ladder()})


def check_digests(path: Path, backend: str, digests: dict[str, str]) -> None:
    """Compare a backend's digests, preset by preset, with those recorded in path: record the new presets', drop
    the gone presets', fail on a changed one (re-record it when RECORD_VARIABLE is 1)."""
    recorded = json.loads(path.read_text()) if path.exists() else {}
    known = recorded.get(backend, {})
    changed = sorted(p for p in digests if p in known and known[p] != digests[p])
    rerecord = os.environ.get(RECORD_VARIABLE) == "1"
    kept = {p: known[p] for p in digests if p in known and not (rerecord and p in changed)}
    updated = {p: kept.get(p, digests[p]) for p in sorted(digests)}
    if updated != known:
        recorded[backend] = updated
        path.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        _say(f"{path.name}: recorded {backend} digests of {sorted(set(updated) - set(kept)) or 'no preset'}, "
             f"dropped {sorted(set(known) - set(digests)) or 'none'}: commit the file")
    assert rerecord or not changed, (
        f"{backend}: the behaviour of {changed} changed (set {RECORD_VARIABLE}=1 to re-record on purpose)")


def test_a_new_preset_is_recorded_a_gone_one_dropped_and_a_changed_one_fails(tmp_path, monkeypatch):
    path = tmp_path / "digests.json"
    path.write_text(json.dumps({"scripted": {"beam": "1", "gone": "0"}, "simulated": {"beam": "5"}}))
    with pytest.warns(UserWarning, match=r"recorded scripted digests of \['new'\], dropped \['gone'\]"):
        check_digests(path, "scripted", {"beam": "1", "new": "2"})
    assert json.loads(path.read_text()) == {"scripted": {"beam": "1", "new": "2"}, "simulated": {"beam": "5"}}
    with pytest.raises(AssertionError, match="behaviour of \\['new'\\] changed"):
        check_digests(path, "scripted", {"beam": "1", "new": "3"})
    assert json.loads(path.read_text())["scripted"]["new"] == "2"
    monkeypatch.setenv(RECORD_VARIABLE, "1")
    with pytest.warns(UserWarning, match="recorded scripted digests of"):
        check_digests(path, "scripted", {"beam": "1", "new": "3"})
    assert json.loads(path.read_text())["scripted"] == {"beam": "1", "new": "3"}


def _say(message: str) -> None:
    print(message)
    warnings.warn(message, stacklevel=2)
