"""One batch of problems on a fresh simulation, for the problem-by-problem pairing scripts.

The pairing scripts (`benchmarks/kv_retention_paired.py`, `docs/bench/sim/a100-7b-early-exit-paired/paired.py`,
`docs/bench/partial-rejection/paired.py`) compare variants on the same problems and request seeds: every request
of a batch carries the batch's seed (not `runs.paired_seed`'s per-problem seeds), and each batch starts at
virtual time 0 with empty KV pools, so a batch is a deterministic function of its arguments.

    with simulated_batch("specscale", seed=0, problems=300, in_flight=32, beam_size=8) as batch:
        batch.results, batch.runtime.metrics, batch.elapsed_s ...

The simulation is closed when the block ends; read everything needed from it inside the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from specscale.runtime.runtime import SearchRuntime
from specscale.search.presets import preset_config
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.workload import WorkloadParams


@dataclass
class SimulatedBatch:
    """A finished batch: its simulation and runtime (open until the block ends), problems, results and ids."""

    sim: Simulation
    runtime: SearchRuntime
    problems: list
    request_ids: list[str]
    results: list
    elapsed_s: float  # virtual seconds from the first admission to the last result


@contextmanager
def simulated_batch(variant: str, seed: int, problems: int, in_flight: int, beam_size: int,
                    workload: WorkloadParams | None = None) -> Iterator[SimulatedBatch]:
    """Runs `problems` problems of `variant` (preset[field=value,...]) at `in_flight` concurrent searches."""
    sim = Simulation(SimulationConfig(seed=0, workload=workload))
    try:
        runtime = sim.runtime(max_concurrency=in_flight)
        chosen = sim.problems(problems)
        search = preset_config(variant, seed=seed, beam_size=beam_size)
        ids = [f"{variant}-{seed}-{i}" for i in range(len(chosen))]
        results = runtime.run([sim.request(p, search, rid) for p, rid in zip(chosen, ids, strict=True)])
        yield SimulatedBatch(sim, runtime, chosen, ids, results, sim.clock())
    finally:
        sim.close()
